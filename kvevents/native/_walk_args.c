/* The index walk's arguments (see _walk.c): parsed and checked, the PrefixMatch to fill made, the plan's
 * views opened, the weights read, and the WordLayouts flattened into arrays, all in one Walk. */
#include "_walk.h"
#ifndef Py_T_OBJECT_EX /* before 3.12 the member kinds live in structmember.h */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

/* attribute names, interned once (a C-string attribute lookup builds a str per call) */
static PyObject *s_cols, *s_word, *s_alive, *s_workers;

int kv_walk_init(void) {
    return (s_cols = PyUnicode_InternFromString("cols")) && (s_word = PyUnicode_InternFromString("word")) &&
                   (s_alive = PyUnicode_InternFromString("alive")) &&
                   (s_workers = PyUnicode_InternFromString("workers"))
               ? 0
               : -1;
}

/* Only the scalars and pointers: never the view arrays (~37 KB), so a walk starts without a memset. */
void kv_walk_zero(Walk *W) {
    W->wm_fields = W->pm_fields = NULL;
    W->wm_off[0] = W->wm_off[1] = W->wm_off[2] = 0;
    W->hb_held = W->nloaded = 0;
    W->wcols = W->wmi = W->wstart = W->slots = NULL;
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

int kv_walk_parse(Walk *W, PyObject *args) {
    PyObject *hashes;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!OOO|OO", &hashes, &PyList_Type, &W->plan, &PyList_Type, &W->layout,
                          &PyList_Type, &W->media, &PyList_Type, &W->weights, &W->pm_cls, &W->wm_cls, &W->sum_fn,
                          &W->wm_fields, &W->pm_fields))
        return -1;
    if (W->wm_fields == Py_None) W->wm_fields = NULL;
    if (W->pm_fields == Py_None) W->pm_fields = NULL;
    if (W->pm_fields && check_pm_fields(W->pm_cls, W->pm_fields) < 0) return -1;
    if (W->wm_fields && check_wm_fields(W->wm_cls, W->wm_fields, W->wm_off) < 0) return -1;
    if (kv_get_buf(hashes, &W->hb, 8, "ql", 0, "hashes") < 0) return -1;
    W->hb_held = 1;
    W->q = W->hb.buf;
    W->n = W->hb.len / 8;
    W->nv = PyList_GET_SIZE(W->plan);
    W->nw = PyList_GET_SIZE(W->layout);
    W->nmedia = PyList_GET_SIZE(W->media);
    return 0;
}

/* The PrefixMatch(n) to fill, and its workers dict. */
int kv_walk_result(Walk *W) {
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

/* The plan's (view, filter) pairs, all with the same mask columns. */
int kv_walk_plan(Walk *W) {
    W->nc = -1;
    for (Py_ssize_t i = 0; i < W->nv; i++) {
        PyObject *e = PyList_GET_ITEM(W->plan, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
            PyErr_SetString(PyExc_ValueError, "plan entries must be (view, filter)");
            return -1;
        }
        W->filt[i] = NULL;
        if (kv_view_load(PyTuple_GET_ITEM(e, 0), &W->views[i], 0) < 0) return -1;
        W->nloaded++;
        if (W->nc >= 0 && W->views[i].nc != W->nc) {
            PyErr_SetString(PyExc_ValueError, "views differ in mask columns");
            return -1;
        }
        W->nc = W->views[i].nc;
        PyObject *f = PyTuple_GET_ITEM(e, 1);
        if (f == Py_None) continue;
        if (kv_get_buf(f, &W->fb[i], 8, "QL", 0, "filter") < 0) return -1;
        W->filt[i] = W->fb[i].buf;
        if (W->fb[i].len / 8 != W->nc) {
            PyErr_SetString(PyExc_ValueError, "filter length differs from the mask columns");
            return -1;
        }
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

/* One scratch block, 8-byte parts first: wstart, wword, walive, acc, row, slots, nend, ends, endorder
 * (only nend must start at zero; `ends` is written before it is read). */
static int alloc_scratch(Walk *W) {
    Py_ssize_t nw = W->nw;
    size_t n8 = (size_t)(nw + 1) + 3 * (size_t)nw + (size_t)W->nc + (size_t)W->nv * 2 * BLOCK;
    W->scratch = PyMem_Malloc(n8 * 8 + (size_t)nw * 4 + (size_t)nw * KV_WORD * 4 + (size_t)nw * KV_WORD + 8);
    if (!W->scratch) { PyErr_NoMemory(); return -1; }
    W->wstart = (Py_ssize_t *)W->scratch;
    W->wword = (int64_t *)(W->wstart + nw + 1);
    W->walive = (uint64_t *)(W->wword + nw);
    W->acc = W->walive + nw;
    W->row = W->acc + nw;
    W->slots = (Py_ssize_t *)(W->row + W->nc);
    W->nend = (int32_t *)(W->slots + (size_t)W->nv * 2 * BLOCK);
    W->ends = W->nend + nw;
    W->endorder = (uint8_t *)(W->ends + (size_t)nw * KV_WORD);
    memset(W->nend, 0, (size_t)nw * sizeof(int32_t));
    return 0;
}

/* Columns over all WordLayouts (each must have at least one). */
static int count_columns(const Walk *W, Py_ssize_t *total) {
    *total = 0;
    for (Py_ssize_t w = 0; w < W->nw; w++) {
        PyObject *cols = PyObject_GetAttr(PyList_GET_ITEM(W->layout, w), s_cols);
        if (!cols) return -1;
        int ok = PyList_Check(cols) && PyList_GET_SIZE(cols) >= 1;
        if (ok) *total += PyList_GET_SIZE(cols);
        Py_DECREF(cols);
        if (!ok) { PyErr_SetString(PyExc_ValueError, "WordLayout.cols must be a non-empty list"); return -1; }
    }
    return 0;
}

/* Word w's word number, alive bits and (column, medium index) pairs from its WordLayout, at *at on. */
static int load_word(Walk *W, Py_ssize_t w, Py_ssize_t *at) {
    PyObject *lay = PyList_GET_ITEM(W->layout, w);
    PyObject *cols = PyObject_GetAttr(lay, s_cols), *word = PyObject_GetAttr(lay, s_word);
    PyObject *alive = PyObject_GetAttr(lay, s_alive);
    int bad = !cols || !word || !alive;
    if (!bad) {
        if (kv_as_i64(word, &W->wword[w], "WordLayout.word") < 0 || W->wword[w] < 0 || W->wword[w] > ((int64_t)1 << 40)) bad = 1;
        else {
            W->walive[w] = PyLong_AsUnsignedLongLong(alive);
            if (PyErr_Occurred()) { PyErr_Clear(); PyErr_SetString(PyExc_ValueError, "WordLayout.alive must be a 64-bit mask"); bad = 1; }
        }
    }
    W->wstart[w] = *at;
    for (Py_ssize_t c = 0; !bad && c < PyList_GET_SIZE(cols); c++) {
        PyObject *pair = PyList_GET_ITEM(cols, c);
        int64_t col, mi;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || kv_as_i64(PyTuple_GET_ITEM(pair, 0), &col, "column") < 0 ||
            kv_as_i64(PyTuple_GET_ITEM(pair, 1), &mi, "medium index") < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "WordLayout.cols entries must be (column, medium index)"); bad = 1; break; }
        if (col < 0 || col >= W->nc || mi < 0 || mi >= W->nmedia) { PyErr_SetString(PyExc_ValueError, "layout column or medium index out of range"); bad = 1; break; }
        W->wcols[*at] = (Py_ssize_t)col; W->wmi[*at] = (Py_ssize_t)mi; (*at)++;
    }
    Py_XDECREF(cols); Py_XDECREF(word); Py_XDECREF(alive);
    if (bad) return -1;
    W->acc[w] = W->walive[w];
    return 0;
}

/* The layout's words flattened into arrays, and the credit table when a word has several columns. */
int kv_walk_layout(Walk *W) {
    Py_ssize_t ncolsall;
    if (alloc_scratch(W) < 0 || count_columns(W, &ncolsall) < 0) return -1;
    W->wcols = PyMem_Calloc(ncolsall + 1, sizeof(Py_ssize_t));
    W->wmi = PyMem_Calloc(ncolsall + 1, sizeof(Py_ssize_t));
    if (!W->wcols || !W->wmi) { PyErr_NoMemory(); return -1; }
    Py_ssize_t at = 0;
    int anymulti = 0;
    for (Py_ssize_t w = 0; w < W->nw; w++) {
        if (load_word(W, w, &at) < 0) return -1;
        if (at - W->wstart[w] > 1) anymulti = 1;
    }
    W->wstart[W->nw] = at;
    if (anymulti) {
        W->credit = PyMem_Calloc((size_t)W->nw * W->nmedia * KV_WORD, sizeof(int32_t));
        if (!W->credit) { PyErr_NoMemory(); return -1; }
    }
    return 0;
}

