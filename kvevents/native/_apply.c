/* The index's apply loops over table views (twins of HashTable.set_bits_each in consumers/table.py
 * and remove_each, clear_worker in consumers/copies.py), the one-key holds_bit probe, and the int64
 * check of a batch's hashes before they are applied (consumers/indexer.py's _all_int64). A slot's
 * holders are read and written through _holders.h. */
#include "_holders.h"
/* all_int64(hashes, prev) -> bool: every hash (and prev, unless None) an exact int in int64 range. */
PyObject *kv_all_int64(PyObject *self, PyObject *args) {
    PyObject *hashes, *prev;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &hashes, &prev)) return NULL;
    for (Py_ssize_t i = 0; i <= PyList_GET_SIZE(hashes); i++) {
        PyObject *it = i < PyList_GET_SIZE(hashes) ? PyList_GET_ITEM(hashes, i) : prev;
        if (it == Py_None && i == PyList_GET_SIZE(hashes)) break;
        if (!PyLong_CheckExact(it)) Py_RETURN_FALSE;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(it, &overflow);
        if (overflow) Py_RETURN_FALSE;
        if (v == -1 && PyErr_Occurred()) return NULL;
    }
    Py_RETURN_TRUE;
}

/* The int64 values of a list or tuple of ints (PyMem_Free it), or NULL with ValueError. */
static int64_t *ints_of(PyObject *seq, Py_ssize_t *n, const char *what) {
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyErr_Format(PyExc_ValueError, "%s must be a list of ints", what);
        return NULL;
    }
    *n = PySequence_Fast_GET_SIZE(seq);
    if (*n > MAX_PAGES) { PyErr_Format(PyExc_ValueError, "%s: too many", what); return NULL; }
    int64_t *out = PyMem_Malloc(sizeof(int64_t) * (*n + 1));
    if (!out) { PyErr_NoMemory(); return NULL; }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < *n; i++)
        if (kv_as_i64(items[i], &out[i], what) < 0) { PyMem_Free(out); return NULL; }
    return out;
}

/* A worker's bit argument: a non-zero mask within one column's 32 bits, else ValueError. */
static int bit_of(PyObject *o, uint64_t *bit) {
    *bit = PyLong_Check(o) ? PyLong_AsUnsignedLongLong(o) : 0;
    if (PyErr_Occurred() || !*bit || *bit > KV_LOW) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "bit must be a non-zero 32-bit mask");
        return -1;
    }
    return 0;
}

/* A column argument: 0..MAX_COLUMN, else ValueError. */
static int col_of(PyObject *o, uint64_t *col) {
    int64_t c;
    if (kv_as_i64(o, &c, "col") < 0) return -1;
    if (c < 0 || c > MAX_COLUMN) { PyErr_SetString(PyExc_ValueError, "col out of range"); return -1; }
    *col = (uint64_t)c;
    return 0;
}

/* A slot for absent key h: the first free one from its home bucket on (room must be reserved), a key
 * off its home noted in the spill. The slot (now LIVE), or -1 with ValueError; *used counts fresh slots. */
static Py_ssize_t place_key(View *v, int64_t h, Py_ssize_t home, Py_ssize_t *used) {
    Py_ssize_t b = home, s;
    for (Py_ssize_t tries = 0;; b = (b + 1) & (v->buckets - 1)) {
        if (tries++ >= v->buckets) { PyErr_SetString(PyExc_ValueError, "table full: reserve room first"); return -1; }
        uint64_t word;
        memcpy(&word, v->state + b * KV_SLOTS, 8);
        uint64_t free = ~word & KV_LIVE_BYTES;
        if (!free) continue;
        s = b * KV_SLOTS + (CTZ64(free) >> 3);
        break;
    }
    if (v->state[s] == KV_EMPTY) (*used)++;
    v->state[s] = KV_LIVE;
    v->keys[s] = h;
    v->rows[s] = 0;
    if (b != home) {
        v->over[home] = 1;
        PyObject *kk = PyLong_FromLongLong(h), *ss = PyLong_FromSsize_t(s);
        int rc = kk && ss ? PyDict_SetItem(v->spill, kk, ss) : -1;
        Py_XDECREF(kk); Py_XDECREF(ss);
        if (rc < 0) return -1;
    }
    return s;
}

typedef struct {
    Py_ssize_t live, used, stop;
    int64_t need;
} StoreCounts;

/* The store loop: each key found or placed, `bit` set in column col (keys that had it go to dups; a key
 * whose holders become the previous key's names its record), its parent recorded. It stops before the
 * first key whose record does not fit the pool (c->stop, c->need). 0, or -1 on error. */
static int store_loop(View *v, const int64_t *hs, PyObject **items, Py_ssize_t n, uint64_t col, uint64_t bit,
                      int have_prev, int64_t prev, PyObject *dups, StoreCounts *c) {
    uint64_t pw = 0; /* the previous key's rows word */
    if (have_prev) {
        Py_ssize_t ps = probe(v, prev, home_of(v, prev));
        if (ps == -2) return -1;
        if (ps >= 0) pw = v->rows[ps];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t h = hs[i];
        Py_ssize_t home = home_of(v, h);
        Py_ssize_t s = probe(v, h, home);
        if (s == -2) return -1;
        int dup = 0;
        if (s < 0) {
            if ((s = place_key(v, h, home, &c->used)) < 0) return -1;
            c->live++;
            v->rows[s] = col << 32 | bit;
        } else {
            int rc = set_bit(v, s, col, bit, pw, &dup, &c->need);
            if (rc < 0) return -1;
            if (rc == 1) { c->stop = i; return 0; }
        }
        pw = v->rows[s];
        if (dup && PyList_Append(dups, items[i]) < 0) return -1;
        if (have_prev) {
            v->parent[s] = prev;
            v->state[s] |= KV_HAS_PARENT;
        }
        prev = h;
        have_prev = 1;
    }
    return 0;
}

/* set_bits_each(cview, hashes, col, bit, prev) -> (duplicates, live added, used added, stop, need), or
 * None when a hash equals the table's vacant key (the Python twin moves it). The twin of
 * HashTable.set_bits_each; room must be reserved first (a full table raises ValueError). stop is -1 when
 * every hash went in, else the first hash not stored: the pool needs `need` more words first. */
PyObject *kv_set_bits_each(PyObject *self, PyObject *args) {
    PyObject *tv, *hashes, *colobj, *bitobj, *prevobj;
    if (!PyArg_ParseTuple(args, "OOOOO", &tv, &hashes, &colobj, &bitobj, &prevobj)) return NULL;
    uint64_t bit, col;
    if (col_of(colobj, &col) < 0 || bit_of(bitobj, &bit) < 0) return NULL;
    int64_t prev = 0;
    int have_prev = prevobj != Py_None;
    if (have_prev && kv_as_i64(prevobj, &prev, "prev") < 0) return NULL;
    Py_ssize_t n;
    int64_t *hs = ints_of(hashes, &n, "hashes");
    if (!hs) return NULL;
    View v;
    if (kv_view_load(tv, &v, 1) < 0) { PyMem_Free(hs); return NULL; }
    PyObject *dups = NULL, *ret = NULL;
    StoreCounts c = {0, 0, -1, 0};
    for (Py_ssize_t i = 0; i < n; i++)
        if (hs[i] == v.vacant) { ret = Py_NewRef(Py_None); goto out; }
    if (!(dups = PyList_New(0))) goto out;
    if (store_loop(&v, hs, PySequence_Fast_ITEMS(hashes), n, col, bit, have_prev, prev, dups, &c) == 0)
        ret = Py_BuildValue("(OnnnL)", dups, c.live, c.used, c.stop, (long long)c.need);
out:
    Py_XDECREF(dups);
    kv_view_release(&v);
    PyMem_Free(hs);
    return ret;
}

/* Delete slot s (its holders gone): its key off the spill, a tombstone. 0, or -1 on error. */
static int delete_slot(View *v, Py_ssize_t s) {
    if (PyDict_GET_SIZE(v->spill)) {
        int64_t k = v->keys[s];
        if (s / KV_SLOTS != home_of(v, k)) {
            PyObject *kk = PyLong_FromLongLong(k);
            if (!kk || PyDict_DelItem(v->spill, kk) < 0) { Py_XDECREF(kk); return -1; }
            Py_DECREF(kk);
        }
    }
    v->keys[s] = v->vacant;
    v->state[s] = KV_TOMB;
    v->rows[s] = 0;
    return 0;
}

/* Clear `bit` of column col in slot s (`all`, *k: as clear_bit), deleting a slot left with no holder: 0
 * not set, 1 cleared, 2 the slot went too, -1 error. */
static int clear_and_delete(View *v, Py_ssize_t s, uint64_t col, uint64_t bit, int all, Py_ssize_t *k) {
    int rc = clear_bit(v, s, col, bit, all, k);
    if (rc == 2 && delete_slot(v, s) < 0) return -1;
    return rc;
}

/* Would take_extra take a copy (a count other than 0 under the key)? 1, 0, or -1 on error. */
static int has_extra(PyObject *extra, PyObject *vid, PyObject *mi, PyObject *wi, PyObject *h) {
    PyObject *key = PyTuple_Pack(4, vid, mi, wi, h);
    if (!key) return -1;
    PyObject *more = PyDict_GetItemWithError(extra, key);
    Py_DECREF(key);
    if (!more) return PyErr_Occurred() ? -1 : 0;
    int z = PyObject_Not(more);
    return z < 0 ? -1 : !z;
}

/* Take one extra copy of (vid, mi, wi, h) from `extra` if there is one: 1 taken, 0 none, -1 error. */
static int take_extra(PyObject *extra, PyObject *vid, PyObject *mi, PyObject *wi, PyObject *h) {
    PyObject *key = PyTuple_Pack(4, vid, mi, wi, h);
    if (!key) return -1;
    PyObject *more = PyDict_GetItemWithError(extra, key);
    int rc = 0;
    if (more) {
        long long m = PyLong_AsLongLong(more);
        if (m == -1 && PyErr_Occurred()) rc = -1;
        else if (m == 0) rc = 0;
        else if (m == 1) rc = PyDict_DelItem(extra, key) < 0 ? -1 : 1;
        else {
            PyObject *less = PyLong_FromLongLong(m - 1);
            rc = less && PyDict_SetItem(extra, key, less) == 0 ? 1 : -1;
            Py_XDECREF(less);
        }
    } else if (PyErr_Occurred()) rc = -1;
    Py_DECREF(key);
    return rc;
}

/* Which view holds h with `bit` in column col: *holder (a position; -1: none) and its *slot, the view
 * whose id is `prefer` winning (no preference: the first). 1 when several hold it, 0 one or none, -1 error. */
static int find_holder(View *views, const int64_t *vids, Py_ssize_t nv, int64_t h, uint64_t col, uint64_t bit,
                       int64_t prefer, int have_prefer, Py_ssize_t *holder, Py_ssize_t *slot) {
    int several = 0;
    *holder = -1;
    for (Py_ssize_t pos = 0; pos < nv; pos++) {
        View *v = &views[pos];
        Py_ssize_t s = probe(v, h, home_of(v, h));
        if (s == -2) return -1;
        if (s < 0) continue;
        uint64_t bits;
        if (row_bits(v, v->rows[s], col, &bits) < 0) return -1;
        if (!(bits & bit)) continue;
        if (*holder >= 0) {
            several = 1;
            if (have_prefer && vids[*holder] == prefer) break;
        }
        if (*holder < 0 || (have_prefer && vids[pos] == prefer)) { *holder = pos; *slot = s; }
        if (several && !have_prefer) break;
    }
    return several;
}

typedef struct {
    PyObject *extra, *mio, *wio, **vido;
    const int64_t *vids;
    uint64_t col, bit;
    int64_t prefer;
    int have_prefer, exact;
    Py_ssize_t unknown, ambiguous, *removed, *deleted, stop, stop_view;
    int64_t need;
} RemoveArgs;

/* Does hash i's clear need pool room that is not there (a shared record's copy)? 1 (a->stop, stop_view
 * and need set: nothing done for it), 0, -1 on error. */
static int remove_stops(View *views, RemoveArgs *a, PyObject *h, Py_ssize_t i, Py_ssize_t holder, Py_ssize_t slot) {
    int64_t need = clear_need(&views[holder], slot, a->col, a->bit);
    if (need <= 0) return (int)need;
    int taken = PyDict_GET_SIZE(a->extra) ? has_extra(a->extra, a->vido[holder], a->mio, a->wio, h) : 0;
    if (taken) return taken < 0 ? -1 : 0;
    a->stop = i;
    a->stop_view = holder;
    a->need = need;
    return 1;
}

/* The remove loop: for each hash, its holder's extra copy taken, or its bit cleared (slots left empty
 * deleted, counted per view). It stops before the first hash whose clear needs pool room (a->stop).
 * 0, or -1 on error. */
static int remove_loop(View *views, Py_ssize_t nv, RemoveArgs *a, const int64_t *hs, PyObject **items, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t holder, slot = -1, k;
        int several = find_holder(views, a->vids, nv, hs[i], a->col, a->bit, a->prefer, a->have_prefer, &holder, &slot);
        if (several < 0) return -1;
        if (holder < 0) { a->unknown++; continue; }
        int stops = remove_stops(views, a, items[i], i, holder, slot);
        if (stops) return stops < 0 ? -1 : 0;
        if (several && !(a->exact && a->have_prefer && a->vids[holder] == a->prefer)) a->ambiguous++;
        a->removed[holder]++;
        if (PyDict_GET_SIZE(a->extra)) {
            int t = take_extra(a->extra, a->vido[holder], a->mio, a->wio, items[i]);
            if (t < 0) return -1;
            if (t) continue;
        }
        int d = clear_and_delete(&views[holder], slot, a->col, a->bit, 0, &k);
        if (d < 0) return -1;
        a->deleted[holder] += d == 2;
    }
    return 0;
}

/* The (view list, id list) pair of remove_each, opened: views[] and vids[] of nv entries (PyMem_Free
 * both; release the views). 0, or -1 with ValueError. */
static int open_views(PyObject *tvs, PyObject *vidl, View **views, int64_t **vids, int *loaded) {
    Py_ssize_t nv = PyList_GET_SIZE(tvs);
    *loaded = 0;
    if (nv > MAX_VIEWS || nv < 1 || PyList_GET_SIZE(vidl) != nv) {
        PyErr_SetString(PyExc_ValueError, "1 to 4096 views, one id each");
        return -1;
    }
    *views = PyMem_Calloc((size_t)nv, sizeof(View));
    *vids = PyMem_Calloc((size_t)nv, sizeof(int64_t));
    if (!*views || !*vids) { PyErr_NoMemory(); return -1; }
    for (; *loaded < nv; (*loaded)++) {
        if (kv_as_i64(PyList_GET_ITEM(vidl, *loaded), &(*vids)[*loaded], "view id") < 0) return -1;
        if (kv_view_load(PyList_GET_ITEM(tvs, *loaded), &(*views)[*loaded], 1) < 0) return -1;
    }
    return 0;
}

static PyObject *counts_list(const Py_ssize_t *c, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *x = PyLong_FromSsize_t(c[i]);
        if (!x) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, x);
    }
    return out;
}

/* remove_each(cviews, vids, extra, mi, col, wi, hashes, prefer, exact) -> (unknown, ambiguous, [copies
 * removed per view], [rows deleted per view], stop, stop view, need). The twin of
 * consumers.copies.remove_each. stop is -1 when every hash was done, else the first hash not done: view
 * `stop view`'s pool needs `need` more words first (the caller grows it and goes on from there). */
PyObject *kv_remove_each(PyObject *self, PyObject *args) {
    PyObject *tvs, *vidl, *colo, *hashes, *prefo;
    RemoveArgs a = {0};
    a.stop = a.stop_view = -1;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOp", &PyList_Type, &tvs, &PyList_Type, &vidl, &PyDict_Type, &a.extra,
                          &a.mio, &colo, &a.wio, &hashes, &prefo, &a.exact))
        return NULL;
    int64_t wi;
    if (kv_as_i64(a.wio, &wi, "wi") < 0 || wi < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "wi must be >= 0"); return NULL; }
    if (!PyLong_Check(a.mio)) { PyErr_SetString(PyExc_ValueError, "mi must be an int"); return NULL; }
    if (col_of(colo, &a.col) < 0) return NULL;
    a.have_prefer = prefo != Py_None;
    if (a.have_prefer && kv_as_i64(prefo, &a.prefer, "prefer") < 0) return NULL;
    a.bit = (uint64_t)1 << (wi % KV_WORD);
    Py_ssize_t n;
    int64_t *hs = ints_of(hashes, &n, "hashes");
    if (!hs) return NULL;
    View *views = NULL;
    int64_t *vids = NULL;
    int loaded = 0;
    PyObject *ret = NULL, *rl = NULL, *dl = NULL;
    if (open_views(tvs, vidl, &views, &vids, &loaded) < 0) goto out;
    Py_ssize_t nv = PyList_GET_SIZE(tvs);
    a.vids = vids;
    a.vido = PySequence_Fast_ITEMS(vidl);
    a.removed = PyMem_Calloc((size_t)nv * 2, sizeof(Py_ssize_t));
    if (!a.removed) { PyErr_NoMemory(); goto out; }
    a.deleted = a.removed + nv;
    if (remove_loop(views, nv, &a, hs, PySequence_Fast_ITEMS(hashes), n) < 0) goto out;
    if ((rl = counts_list(a.removed, nv)) && (dl = counts_list(a.deleted, nv)))
        ret = Py_BuildValue("(nnOOnnL)", a.unknown, a.ambiguous, rl, dl, a.stop, a.stop_view, (long long)a.need);
out:
    Py_XDECREF(rl); Py_XDECREF(dl);
    for (int i = 0; i < loaded; i++) kv_view_release(&views[i]);
    PyMem_Free(views); PyMem_Free(vids); PyMem_Free(a.removed); PyMem_Free(hs);
    return ret;
}

/* The columns argument of clear_worker and holds_bit: a list of 0..MAX_COLUMN ints (at most 256). */
static int cols_of(PyObject *cols, uint64_t *out, Py_ssize_t *n) {
    *n = PyList_GET_SIZE(cols);
    if (*n > 256) { PyErr_SetString(PyExc_ValueError, "at most 256 columns"); return -1; }
    for (Py_ssize_t c = 0; c < *n; c++)
        if (col_of(PyList_GET_ITEM(cols, c), &out[c]) < 0) return -1;
    return 0;
}

/* clear_worker(cview, cols, bit) -> (bits cleared, rows deleted): `bit` of each of `cols` cleared in every
 * live slot, slot by slot (a slot left with no holder deleted; a shared record changes once for all the
 * slots naming it, which are all cleared, and counts for each). The twin of consumers.copies.clear_worker. */
PyObject *kv_clear_worker(PyObject *self, PyObject *args) {
    PyObject *tv, *cols, *bito;
    if (!PyArg_ParseTuple(args, "OO!O", &tv, &PyList_Type, &cols, &bito)) return NULL;
    uint64_t bit, cl[256];
    Py_ssize_t nc;
    if (bit_of(bito, &bit) < 0 || cols_of(cols, cl, &nc) < 0) return NULL;
    View v;
    if (kv_view_load(tv, &v, 1) < 0) return NULL;
    Py_ssize_t cleared = 0, deleted = 0;
    int err = 0;
    for (Py_ssize_t s = 0; s < v.n && !err; s++) {
        uint64_t r = v.rows[s];
        if (!(v.state[s] & KV_LIVE) || !r) continue;
        if (r < KV_ROW_REF && !(r & bit)) continue; /* inline, without this worker's bit */
        if (settle_inline(&v, s) < 0) { err = 1; break; }
        for (Py_ssize_t c = 0; c < nc; c++) {
            Py_ssize_t k;
            int rc = clear_and_delete(&v, s, cl[c], bit, 1, &k);
            if (rc < 0) { err = 1; break; }
            cleared += k;
            if (rc == 2) { deleted++; break; }
        }
    }
    kv_view_release(&v);
    if (err) return NULL;
    return Py_BuildValue("(nn)", cleared, deleted);
}

/* holds_bit(cviews, h, cols, bit) -> bool: does any view hold h with `bit` set in any of `cols`? */
PyObject *kv_holds_bit(PyObject *self, PyObject *args) {
    PyObject *tvs, *ho, *cols, *bito;
    if (!PyArg_ParseTuple(args, "O!OO!O", &PyList_Type, &tvs, &ho, &PyList_Type, &cols, &bito)) return NULL;
    int64_t h;
    uint64_t bit, cl[256];
    Py_ssize_t nc;
    if (kv_as_i64(ho, &h, "hash") < 0 || bit_of(bito, &bit) < 0 || cols_of(cols, cl, &nc) < 0) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tvs); i++) {
        View v;
        if (kv_view_load(PyList_GET_ITEM(tvs, i), &v, 0) < 0) return NULL;
        Py_ssize_t s = probe(&v, h, home_of(&v, h));
        int found = 0;
        for (Py_ssize_t c = 0; s >= 0 && c < nc && !found; c++) {
            uint64_t bits;
            if (row_bits(&v, v.rows[s], cl[c], &bits) < 0) { s = -2; break; }
            found = (bits & bit) != 0;
        }
        kv_view_release(&v);
        if (s == -2) return NULL;
        if (found) Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* The values of a list of exact ints in int64 range (PyMem_Free it); NULL without an exception when one
 * is not (a bool, a float, too big: the caller's slow path says which), NULL with one on no memory. */
static int64_t *exact_ints(PyObject *list, Py_ssize_t n) {
    int64_t *out = PyMem_Malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!out) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyList_GET_ITEM(list, i);
        int overflow = 0;
        long long v = PyLong_CheckExact(it) ? PyLong_AsLongLongAndOverflow(it, &overflow) : 0;
        if (!PyLong_CheckExact(it) || overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); PyMem_Free(out); return NULL; }
        out[i] = (int64_t)v;
    }
    return out;
}

/* Does any of the views (a list of cviews) hold h with `bit` in one of cl[0..nc)? 1, 0, or -1 on error. */
static int views_hold(PyObject *views, int64_t h, const uint64_t *cl, Py_ssize_t nc, uint64_t bit) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(views); i++) {
        View v;
        if (kv_view_load(PyList_GET_ITEM(views, i), &v, 0) < 0) return -1;
        Py_ssize_t s = probe(&v, h, home_of(&v, h));
        int found = 0;
        for (Py_ssize_t c = 0; s >= 0 && c < nc && !found; c++) {
            uint64_t bits;
            if (row_bits(&v, v.rows[s], cl[c], &bits) < 0) { s = -2; break; }
            found = (bits & bit) != 0;
        }
        kv_view_release(&v);
        if (s == -2) return -1;
        if (found) return 1;
    }
    return 0;
}

/* store_event(cview, hashes, col, bit, prev, parent_views, parent_cols) -> (duplicates, live added, used
 * added, stop, need, parent held) or None: one BlockStored in one call, the common case of
 * BlockIndex._store. Before anything is written: every hash and prev must be an exact int in int64 range
 * and none the vacant key (else None: the caller's general path counts or handles it), and whether the
 * worker holds `prev` (in parent_views, in any of parent_cols) is looked up. Then set_bits_each's loop. */
PyObject *kv_store_event(PyObject *self, PyObject *args) {
    PyObject *tv, *hashes, *colobj, *bitobj, *prevobj, *pviews, *pcols;
    if (!PyArg_ParseTuple(args, "OO!OOOO!O!", &tv, &PyList_Type, &hashes, &colobj, &bitobj, &prevobj, &PyList_Type,
                          &pviews, &PyList_Type, &pcols))
        return NULL;
    uint64_t bit, col, cl[256];
    Py_ssize_t ncl;
    if (col_of(colobj, &col) < 0 || bit_of(bitobj, &bit) < 0 || cols_of(pcols, cl, &ncl) < 0) return NULL;
    int64_t prev = 0;
    int have_prev = prevobj != Py_None, overflow = 0;
    if (have_prev) {
        long long pv = PyLong_CheckExact(prevobj) ? PyLong_AsLongLongAndOverflow(prevobj, &overflow) : 0;
        if (!PyLong_CheckExact(prevobj) || overflow || (pv == -1 && PyErr_Occurred())) { PyErr_Clear(); Py_RETURN_NONE; }
        prev = (int64_t)pv;
    }
    Py_ssize_t n = PyList_GET_SIZE(hashes);
    int64_t *hs = exact_ints(hashes, n);
    if (!hs) { if (PyErr_Occurred()) return NULL; Py_RETURN_NONE; }
    PyObject *dups = NULL, *ret = NULL;
    int held = have_prev && PyList_GET_SIZE(pviews) ? views_hold(pviews, prev, cl, ncl, bit) : 0;
    View v;
    if (held < 0 || kv_view_load(tv, &v, 1) < 0) { PyMem_Free(hs); return NULL; }
    StoreCounts c = {0, 0, -1, 0};
    for (Py_ssize_t i = 0; i < n; i++)
        if (hs[i] == v.vacant) { ret = Py_NewRef(Py_None); goto out; }
    if (!(dups = PyList_New(0))) goto out;
    if (store_loop(&v, hs, PySequence_Fast_ITEMS(hashes), n, col, bit, have_prev, prev, dups, &c) == 0)
        ret = Py_BuildValue("(OnnnLO)", dups, c.live, c.used, c.stop, (long long)c.need, held ? Py_True : Py_False);
out:
    Py_XDECREF(dups);
    kv_view_release(&v);
    PyMem_Free(hs);
    return ret;
}
