/* The index walk's arguments (see _walk.c): parsed and checked, the PrefixMatch to fill made, the plan's
 * views opened, the weights read, and the packed layout (_walk_layout.c) copied into arrays, all in one Walk. */
#include "_walk.h"
#ifndef Py_T_OBJECT_EX /* before 3.12 the member kinds live in structmember.h */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

/* attribute names, interned once (a C-string attribute lookup builds a str per call) */
static PyObject *s_workers;

int kv_walk_init(void) {
    return (s_workers = PyUnicode_InternFromString("workers")) && kv_layout_init() == 0 ? 0 : -1;
}

/* Only the scalars and pointers (the per-view arrays are allocated for the plan). */
void kv_walk_zero(Walk *W) {
    W->wm_fields = W->pm_fields = NULL;
    W->wm_off[0] = W->wm_off[1] = W->wm_off[2] = 0;
    W->hb_held = W->nloaded = 0;
    W->feed = NULL;
    W->views = NULL;
    W->fb = NULL;
    W->filt = NULL;
    W->wcols = W->wmi = W->wstart = W->slots = W->act = NULL;
    W->nact = 0;
    W->rw = W->prev = NULL;
    W->colword = NULL;
    W->wword = NULL;
    W->walive = W->acc = W->row = NULL;
    W->ends = W->credit = W->nend = NULL;
    W->endorder = NULL;
    W->wts = NULL;
    W->scratch = NULL;
    W->result = W->workers = W->last_pg = W->last_score = NULL;
    W->last_pages = -1;
    W->last_mi = -1;
}

void kv_walk_free(Walk *W) {
    Py_XDECREF(W->workers);
    Py_XDECREF(W->last_pg);
    Py_XDECREF(W->last_score);
    for (int i = 0; i < W->nloaded; i++) {
        kv_view_release(&W->views[i]);
        if (W->filt[i]) PyBuffer_Release(&W->fb[i]);
    }
    if (W->hb_held) PyBuffer_Release(&W->hb);
    PyMem_Free(W->views); PyMem_Free(W->fb); PyMem_Free(W->filt);
    PyMem_Free(W->wcols); PyMem_Free(W->wmi); PyMem_Free(W->scratch); PyMem_Free(W->credit); PyMem_Free(W->wts);
}

/* ------------------------------------------------------------------ arguments */

/* pm_fields: the (pages, workers) slot descriptors of the PrefixMatch class. */
static int check_pm_fields(PyObject *cls, PyObject *fields) {
    int ok = PyType_Check(cls) && PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == 2;
    for (int f = 0; ok && f < 2; f++) {
        PyObject *d = PyTuple_GET_ITEM(fields, f);
        ok = Py_TYPE(d) == &PyMemberDescr_Type && PyDescr_TYPE(d) == (PyTypeObject *)cls;
    }
    if (!ok) PyErr_SetString(PyExc_ValueError, "pm_fields must be the 2 slot descriptors of the PrefixMatch class");
    return ok ? 0 : -1;
}

/* wm_fields: the (pages, score, pages_by_medium) slot descriptors of the WorkerMatch class, in __init__
 * order, each a writable object slot (the result's fields are stored at its offset). */
static int check_wm_fields(PyObject *cls, PyObject *fields, Py_ssize_t off[3]) {
    int ok = PyType_Check(cls) && PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == 3;
    for (int f = 0; ok && f < 3; f++) {
        PyObject *d = PyTuple_GET_ITEM(fields, f);
        ok = Py_TYPE(d) == &PyMemberDescr_Type && PyDescr_TYPE(d) == (PyTypeObject *)cls;
        if (ok) {
            PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
            ok = md->type == Py_T_OBJECT_EX && !(md->flags & Py_READONLY) && md->offset >= (Py_ssize_t)sizeof(PyObject) &&
                 md->offset + (Py_ssize_t)sizeof(PyObject *) <= ((PyTypeObject *)cls)->tp_basicsize;
            off[f] = md->offset;
        }
    }
    if (!ok) PyErr_SetString(PyExc_ValueError, "wm_fields must be the 3 slot descriptors of the WorkerMatch class");
    return ok ? 0 : -1;
}

/* The bound arguments (plan, layout, media, weights, PrefixMatch, WorkerMatch, sum[, wm_fields, pm_fields])
 * parsed into W (borrowed from `bound`) and checked, with their sizes. */
int kv_walk_parse_bound(Walk *W, PyObject *bound) {
    if (!PyArg_ParseTuple(bound, "O!O!O!O!OOO|OO", &PyList_Type, &W->plan, &PyBytes_Type, &W->layout, &PyList_Type,
                          &W->media, &PyList_Type, &W->weights, &W->pm_cls, &W->wm_cls, &W->sum_fn, &W->wm_fields,
                          &W->pm_fields))
        return -1;
    if (W->wm_fields == Py_None) W->wm_fields = NULL;
    if (W->pm_fields == Py_None) W->pm_fields = NULL;
    if (W->pm_fields && check_pm_fields(W->pm_cls, W->pm_fields) < 0) return -1;
    if (W->wm_fields && check_wm_fields(W->wm_cls, W->wm_fields, W->wm_off) < 0) return -1;
    W->nv = PyList_GET_SIZE(W->plan);
    if ((W->nw = kv_layout_words(W->layout)) < 0) return -1;
    W->nmedia = PyList_GET_SIZE(W->media);
    if (W->nv > MAX_VIEWS) { PyErr_SetString(PyExc_ValueError, "too many views in the plan"); return -1; }
    if (PyList_GET_SIZE(W->weights) != W->nmedia) {
        PyErr_SetString(PyExc_ValueError, "weights and media differ in length");
        return -1;
    }
    return 0;
}

int kv_walk_hashes(Walk *W, PyObject *hashes) {
    if (kv_get_buf(hashes, &W->hb, 8, "ql", 0, "hashes") < 0) return -1;
    W->hb_held = 1;
    W->q = W->hb.buf;
    W->n = W->hb.len / 8;
    return 0;
}

int kv_walk_prepare(Walk *W) {
    if (!W->nv || !W->nw) return 1; /* nothing to walk: the empty result */
    if (kv_walk_plan(W) < 0) return -1;
    int floats = kv_walk_weights(W);
    if (floats <= 0) return floats;
    return kv_walk_layout(W) < 0 ? -1 : 1;
}

void kv_walk_reset(Walk *W) {
    const Py_ssize_t nw = W->nw;
    for (Py_ssize_t w = 0; w < nw; w++) {
        W->acc[w] = W->walive[w];
        W->act[w] = w;
    }
    W->nact = nw;
    W->tick = 0;
    memset(W->nend, 0, (size_t)nw * sizeof(int32_t));
    memset(W->stampw, 0, (size_t)nw * sizeof(uint32_t));
    memset(W->row, 0, (size_t)W->nc * sizeof(uint64_t)); /* a walk that failed may leave bits in it */
    if (W->credit) memset(W->credit, 0, (size_t)nw * W->nmedia * KV_WORD * sizeof(int32_t));
    W->last_pages = -1;
    W->last_mi = -1;
}

void kv_walk_end_call(Walk *W) {
    if (W->hb_held) PyBuffer_Release(&W->hb);
    W->hb_held = 0;
    W->q = NULL;
    W->n = 0;
    Py_CLEAR(W->workers);
    Py_CLEAR(W->last_pg);
    Py_CLEAR(W->last_score);
}

/* The PrefixMatch(n) to fill, and its workers dict; in columns mode (PrefixMatch class None) no worker
 * matched yet: empty bytes, replaced by the columns when any does. */
int kv_walk_result(Walk *W) {
    if (W->pm_cls == Py_None) {
        W->result = PyBytes_FromStringAndSize(NULL, 0);
        return W->result ? 0 : -1;
    }
    if (W->pm_fields) { /* PrefixMatch's two slots set directly: no __init__ frame */
        PyTypeObject *cls = (PyTypeObject *)W->pm_cls;
        PyObject *r = W->result = cls->tp_alloc(cls, 0);
        PyObject *pg = r ? PyLong_FromSsize_t(W->n) : NULL, *wd = pg ? PyDict_New() : NULL;
        PyObject *d0 = PyTuple_GET_ITEM(W->pm_fields, 0), *d1 = PyTuple_GET_ITEM(W->pm_fields, 1);
        int rc = wd && Py_TYPE(d0)->tp_descr_set(d0, r, pg) == 0 && Py_TYPE(d1)->tp_descr_set(d1, r, wd) == 0 ? 0 : -1;
        Py_XDECREF(pg); Py_XDECREF(wd);
        if (rc < 0) return -1;
    } else {
        W->result = PyObject_CallFunction(W->pm_cls, "n", W->n);
    }
    if (!W->result) return -1;
    W->workers = PyObject_GetAttr(W->result, s_workers);
    if (!W->workers || !PyDict_Check(W->workers)) {
        if (W->workers) PyErr_SetString(PyExc_ValueError, "PrefixMatch.workers must be a dict");
        return -1;
    }
    return 0;
}

/* The plan's (view, filter) pairs; every filter of the same length (nc: the columns; -1 when none). */
int kv_walk_plan(Walk *W) {
    W->nc = -1;
    W->views = PyMem_Calloc((size_t)W->nv, sizeof(View));
    W->fb = PyMem_Calloc((size_t)W->nv, sizeof(Py_buffer));
    W->filt = PyMem_Calloc((size_t)W->nv, sizeof(uint64_t *));
    if (!W->views || !W->fb || !W->filt) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < W->nv; i++) {
        PyObject *e = PyList_GET_ITEM(W->plan, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
            PyErr_SetString(PyExc_ValueError, "plan entries must be (view, filter)");
            return -1;
        }
        W->filt[i] = NULL;
        if (kv_view_load(PyTuple_GET_ITEM(e, 0), &W->views[i], 0) < 0) return -1;
        W->nloaded++;
        PyObject *f = PyTuple_GET_ITEM(e, 1);
        if (f == Py_None) continue;
        if (kv_get_buf(f, &W->fb[i], 8, "QL", 0, "filter") < 0) return -1;
        W->filt[i] = W->fb[i].buf;
        Py_ssize_t len = W->fb[i].len / 8;
        if ((W->nc >= 0 && len != W->nc) || len < 1 || len > MAX_WALK_COLUMNS) {
            PyErr_SetString(PyExc_ValueError, "filters must be of one length (the index's columns)");
            return -1;
        }
        W->nc = len;
    }
    return 0;
}

/* The medium weights as doubles: 1, or 0 when one is not a float (the Python twin keeps int scores). */
int kv_walk_weights(Walk *W) {
    for (Py_ssize_t m = 0; m < W->nmedia; m++)
        if (!PyFloat_CheckExact(PyList_GET_ITEM(W->weights, m))) return 0;
    W->wts = PyMem_Malloc(sizeof(double) * (W->nmedia + 1));
    if (!W->wts) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t m = 0; m < W->nmedia; m++) {
        W->wts[m] = PyFloat_AsDouble(PyList_GET_ITEM(W->weights, m));
        if (W->wts[m] == -1.0 && PyErr_Occurred()) return -1;
    }
    return 1;
}

/* ------------------------------------------------------------------ the layout, flattened */

/* One scratch block, 8-byte parts first: wstart, wword, walive, acc, row, act, slots, rw, prev, nend, ends,
 * colword, endorder (nend must start at zero, colword at -1; `ends` is written before it is read; row
 * starts at zero and every word zeroes the columns it reads). */
static int alloc_scratch(Walk *W) {
    Py_ssize_t nw = W->nw;
    size_t ring = (size_t)W->nv * RING * BLOCK;
    size_t n8 = (size_t)(nw + 1) + 3 * (size_t)nw + (size_t)W->nc + (size_t)nw + 2 * ring + (size_t)W->nv + 2 * (size_t)nw;
    size_t n4 = (size_t)nw + (size_t)nw * KV_WORD + (size_t)W->nc + (size_t)nw;
    W->scratch = PyMem_Malloc(n8 * 8 + n4 * 4 + (size_t)nw * KV_WORD + 8);
    if (!W->scratch) { PyErr_NoMemory(); return -1; }
    W->wstart = (Py_ssize_t *)W->scratch;
    W->wword = (int64_t *)(W->wstart + nw + 1);
    W->walive = (uint64_t *)(W->wword + nw);
    W->acc = W->walive + nw;
    W->row = W->acc + nw;
    W->act = (Py_ssize_t *)(W->row + W->nc);
    W->slots = W->act + nw;
    W->rw = (uint64_t *)(W->slots + ring);
    W->prev = W->rw + ring;
    W->held = W->prev + W->nv;
    W->touch = (Py_ssize_t *)(W->held + nw);
    W->nend = (int32_t *)(W->touch + nw);
    W->ends = W->nend + nw;
    W->colword = W->ends + (size_t)nw * KV_WORD;
    W->stampw = (uint32_t *)(W->colword + W->nc);
    W->endorder = (uint8_t *)(W->stampw + nw);
    W->tick = 0;
    memset(W->nend, 0, (size_t)nw * sizeof(int32_t));
    memset(W->stampw, 0, (size_t)nw * sizeof(uint32_t));
    memset(W->row, 0, (size_t)W->nc * sizeof(uint64_t));
    for (Py_ssize_t c = 0; c < W->nc; c++) W->colword[c] = -1;
    return 0;
}

/* The packed layout (kv_pack_layout, _walk_layout.c) copied into the walk's arrays and checked against
 * this walk's columns and media; the credit table when a word has several columns. */
int kv_walk_layout(Walk *W) {
    const int64_t *L = (const int64_t *)PyBytes_AS_STRING(W->layout);
    Py_ssize_t nw = W->nw, ntot = (Py_ssize_t)L[LAY_NTOT];
    const int64_t *words = L + LAY_HEAD, *alive = words + nw, *start = alive + nw, *cols = start + nw + 1,
                  *mis = cols + ntot;
    int64_t maxcol = -1;
    for (Py_ssize_t c = 0; c < ntot; c++) if (cols[c] > maxcol) maxcol = cols[c];
    if (W->nc < 0) W->nc = maxcol + 1;
    if (maxcol >= W->nc || W->nc < 1 || W->nc > MAX_WALK_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "layout column or medium index out of range");
        return -1;
    }
    if (alloc_scratch(W) < 0) return -1;
    W->wcols = PyMem_Calloc(ntot + 1, sizeof(Py_ssize_t));
    W->wmi = PyMem_Calloc(ntot + 1, sizeof(Py_ssize_t));
    if (!W->wcols || !W->wmi) { PyErr_NoMemory(); return -1; }
    int anymulti = 0;
    for (Py_ssize_t w = 0; w < nw; w++) {
        W->wword[w] = words[w];
        W->walive[w] = W->acc[w] = (uint64_t)alive[w];
        W->wstart[w] = (Py_ssize_t)start[w];
        W->act[w] = w;
        if (start[w + 1] - start[w] > 1) anymulti = 1;
        for (int64_t c = start[w]; c < start[w + 1]; c++) {
            int64_t col = cols[c], mi = mis[c];
            if (col < 0 || mi < 0 || mi >= W->nmedia) { PyErr_SetString(PyExc_ValueError, "layout column or medium index out of range"); return -1; }
            if (W->colword[col] >= 0 && W->colword[col] != (int32_t)w) { PyErr_SetString(PyExc_ValueError, "a column in two words of the layout"); return -1; }
            W->colword[col] = (int32_t)w;
            W->wcols[c] = (Py_ssize_t)col;
            W->wmi[c] = (Py_ssize_t)mi;
        }
    }
    W->wstart[nw] = ntot;
    W->nact = nw;
    if (anymulti) {
        W->credit = PyMem_Calloc((size_t)nw * W->nmedia * KV_WORD, sizeof(int32_t));
        if (!W->credit) { PyErr_NoMemory(); return -1; }
    }
    return 0;
}
