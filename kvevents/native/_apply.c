/* The index's apply loops over table views (twins of HashTable.set_bits_each in consumers/table.py
 * and remove_each in consumers/copies.py), the one-key holds_bit probe, and the int64 check of a
 * batch's hashes before they are applied (consumers/indexer.py's _all_int64). */
#include "_table.h"

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

/* A bit mask argument: a 64-bit int (non-zero when `nonzero`), else ValueError. */
static int bit_of(PyObject *o, uint64_t *bit, int nonzero) {
    *bit = PyLong_Check(o) ? PyLong_AsUnsignedLongLong(o) : 0;
    if (PyErr_Occurred() || (nonzero && !*bit)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, nonzero ? "bit must be a non-zero 64-bit mask" : "bit must be a 64-bit mask");
        return -1;
    }
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
    if (b != home) {
        v->over[home] = 1;
        PyObject *kk = PyLong_FromLongLong(h), *ss = PyLong_FromSsize_t(s);
        int rc = kk && ss ? PyDict_SetItem(v->spill, kk, ss) : -1;
        Py_XDECREF(kk); Py_XDECREF(ss);
        if (rc < 0) return -1;
    }
    return s;
}

/* The store loop: each key found or placed, `bit` set in column col (keys that had it go to dups), its
 * parent recorded. 0, or -1 on error; *live and *used count the slots it filled. */
static int store_loop(View *v, const int64_t *hs, PyObject **items, Py_ssize_t n, Py_ssize_t col, uint64_t bit,
                      int have_prev, int64_t prev, PyObject *dups, Py_ssize_t *live, Py_ssize_t *used) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t h = hs[i];
        Py_ssize_t home = home_of(v, h);
        Py_ssize_t s = probe(v, h, home);
        if (s == -2) return -1;
        if (s < 0) {
            if ((s = place_key(v, h, home, used)) < 0) return -1;
            (*live)++;
        }
        uint64_t *m = v->masks + s * v->nc + col;
        if (*m & bit) {
            if (PyList_Append(dups, items[i]) < 0) return -1;
        } else {
            *m |= bit;
        }
        if (have_prev) {
            v->parent[s] = prev;
            v->state[s] |= KV_HAS_PARENT;
        }
        prev = h;
        have_prev = 1;
    }
    return 0;
}

/* set_bits_each(cview, hashes, col, bit, prev) -> (duplicates, live added, used added), or None when a
 * hash equals the table's vacant key (the Python twin moves it). The twin of HashTable.set_bits_each;
 * room must be reserved first (a full table raises ValueError). */
PyObject *kv_set_bits_each(PyObject *self, PyObject *args) {
    PyObject *tv, *hashes, *bitobj, *prevobj;
    Py_ssize_t col;
    if (!PyArg_ParseTuple(args, "OOnOO", &tv, &hashes, &col, &bitobj, &prevobj)) return NULL;
    uint64_t bit;
    if (bit_of(bitobj, &bit, 1) < 0) return NULL;
    int64_t prev = 0;
    int have_prev = prevobj != Py_None;
    if (have_prev && kv_as_i64(prevobj, &prev, "prev") < 0) return NULL;
    Py_ssize_t n;
    int64_t *hs = ints_of(hashes, &n, "hashes");
    if (!hs) return NULL;
    View v;
    if (kv_view_load(tv, &v, 1) < 0) { PyMem_Free(hs); return NULL; }
    PyObject *dups = NULL, *ret = NULL;
    Py_ssize_t live = 0, used = 0;
    if (col < 0 || col >= v.nc) { PyErr_SetString(PyExc_ValueError, "col out of range"); goto out; }
    for (Py_ssize_t i = 0; i < n; i++)
        if (hs[i] == v.vacant) { ret = Py_NewRef(Py_None); goto out; }
    if (!(dups = PyList_New(0))) goto out;
    if (store_loop(&v, hs, PySequence_Fast_ITEMS(hashes), n, col, bit, have_prev, prev, dups, &live, &used) == 0)
        ret = Py_BuildValue("(Onn)", dups, live, used);
out:
    Py_XDECREF(dups);
    kv_view_release(&v);
    PyMem_Free(hs);
    return ret;
}

/* Clear `bit` of slot s in column col; a row left with no bit is deleted (tombstone). 1: deleted. */
static int clear_bit(View *v, Py_ssize_t s, Py_ssize_t col, uint64_t bit) {
    uint64_t *r = v->masks + s * v->nc;
    r[col] &= ~bit;
    for (Py_ssize_t c = 0; c < v->nc; c++) if (r[c]) return 0;
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
    memset(r, 0, sizeof(uint64_t) * v->nc);
    return 1;
}

/* Take one extra copy of (vid, mi, wi, h) from `extra` if there is one: 1 taken, 0 none, -1 error. */
static int take_extra(PyObject *extra, Py_ssize_t vid, PyObject *mi, PyObject *wi, PyObject *h) {
    PyObject *key = Py_BuildValue("(nOOO)", vid, mi, wi, h);
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

/* Which view holds h with `bit` in column col: *holder (-1: none) and its *slot, the preferred view
 * winning (prefer < 0 with no preference: the first). 1 when several hold it, 0 one or none, -1 error. */
static int find_holder(View *views, Py_ssize_t nv, int64_t h, Py_ssize_t col, uint64_t bit, int64_t prefer,
                       int have_prefer, Py_ssize_t *holder, Py_ssize_t *slot) {
    int several = 0;
    *holder = -1;
    for (Py_ssize_t vid = 0; vid < nv; vid++) {
        View *v = &views[vid];
        Py_ssize_t s = probe(v, h, home_of(v, h));
        if (s == -2) return -1;
        if (s < 0 || !(v->masks[s * v->nc + col] & bit)) continue;
        if (*holder >= 0) {
            several = 1;
            if (*holder == prefer) break;
        }
        if (*holder < 0 || vid == prefer) { *holder = vid; *slot = s; }
        if (several && !have_prefer) break;
    }
    return several;
}

/* The remove loop: for each hash, its holder's extra copy taken, or its bit cleared (rows left empty
 * deleted, counted per view in deleted[]). 0, or -1 on error. */
static int remove_loop(View *views, Py_ssize_t nv, PyObject *extra, PyObject *mio, PyObject *wio, const int64_t *hs,
                       PyObject **items, Py_ssize_t n, Py_ssize_t col, uint64_t bit, int64_t prefer, int have_prefer,
                       int exact, Py_ssize_t counts[3], Py_ssize_t *deleted) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t holder, slot = -1;
        int several = find_holder(views, nv, hs[i], col, bit, prefer, have_prefer, &holder, &slot);
        if (several < 0) return -1;
        if (holder < 0) { counts[0]++; continue; }
        if (several && !(exact && holder == prefer)) counts[1]++;
        counts[2]++;
        if (PyDict_GET_SIZE(extra)) {
            int t = take_extra(extra, holder, mio, wio, items[i]);
            if (t < 0) return -1;
            if (t) continue;
        }
        int d = clear_bit(&views[holder], slot, col, bit);
        if (d < 0) return -1;
        deleted[holder] += d;
    }
    return 0;
}

/* remove_each(cviews, extra, mi, col, wi, hashes, prefer, exact) -> (unknown, ambiguous, removed,
 * [rows deleted per view]). The twin of consumers.copies.remove_each. */
PyObject *kv_remove_each(PyObject *self, PyObject *args) {
    PyObject *tvs, *extra, *mio, *wio, *hashes, *prefo;
    Py_ssize_t col;
    int exact;
    if (!PyArg_ParseTuple(args, "O!O!OnOOOp", &PyList_Type, &tvs, &PyDict_Type, &extra, &mio, &col, &wio, &hashes,
                          &prefo, &exact))
        return NULL;
    int64_t wi, prefer = -1;
    if (kv_as_i64(wio, &wi, "wi") < 0 || wi < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "wi must be >= 0"); return NULL; }
    if (!PyLong_Check(mio)) { PyErr_SetString(PyExc_ValueError, "mi must be an int"); return NULL; }
    if (prefo != Py_None && kv_as_i64(prefo, &prefer, "prefer") < 0) return NULL;
    Py_ssize_t nv = PyList_GET_SIZE(tvs);
    if (nv > MAX_VIEWS || nv < 1) { PyErr_SetString(PyExc_ValueError, "1 to 64 views"); return NULL; }
    Py_ssize_t n;
    int64_t *hs = ints_of(hashes, &n, "hashes");
    if (!hs) return NULL;
    View views[MAX_VIEWS];
    Py_ssize_t deleted[MAX_VIEWS] = {0}, counts[3] = {0, 0, 0}; /* unknown, ambiguous, removed */
    int loaded = 0;
    PyObject *ret = NULL;
    for (; loaded < nv; loaded++) {
        if (kv_view_load(PyList_GET_ITEM(tvs, loaded), &views[loaded], 1) < 0) goto out;
        if (col < 0 || col >= views[loaded].nc) { loaded++; PyErr_SetString(PyExc_ValueError, "col out of range"); goto out; }
    }
    if (remove_loop(views, nv, extra, mio, wio, hs, PySequence_Fast_ITEMS(hashes), n, col,
                    (uint64_t)1 << (wi % KV_WORD), prefer, prefo != Py_None, exact, counts, deleted) < 0)
        goto out;
    PyObject *dl = PyList_New(nv);
    if (!dl) goto out;
    for (Py_ssize_t v = 0; v < nv; v++) PyList_SET_ITEM(dl, v, PyLong_FromSsize_t(deleted[v]));
    ret = Py_BuildValue("(nnnN)", counts[0], counts[1], counts[2], dl);
out:
    for (int i = 0; i < loaded; i++) kv_view_release(&views[i]);
    PyMem_Free(hs);
    return ret;
}

/* holds_bit(cviews, h, cols, bit) -> bool: does any view hold h with `bit` set in any of `cols`? */
PyObject *kv_holds_bit(PyObject *self, PyObject *args) {
    PyObject *tvs, *ho, *cols, *bito;
    if (!PyArg_ParseTuple(args, "O!OO!O", &PyList_Type, &tvs, &ho, &PyList_Type, &cols, &bito)) return NULL;
    int64_t h;
    uint64_t bit;
    if (kv_as_i64(ho, &h, "hash") < 0 || bit_of(bito, &bit, 0) < 0) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tvs); i++) {
        View v;
        if (kv_view_load(PyList_GET_ITEM(tvs, i), &v, 0) < 0) return NULL;
        Py_ssize_t s = probe(&v, h, home_of(&v, h));
        int found = 0;
        for (Py_ssize_t c = 0; s >= 0 && c < PyList_GET_SIZE(cols); c++) {
            int64_t col;
            if (kv_as_i64(PyList_GET_ITEM(cols, c), &col, "column") < 0) { s = -2; break; }
            if (col < 0 || col >= v.nc) { PyErr_SetString(PyExc_ValueError, "column out of range"); s = -2; break; }
            if (v.masks[s * v.nc + col] & bit) { found = 1; break; }
        }
        kv_view_release(&v);
        if (s == -2) return NULL;
        if (found) Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}
