/* Table views: opening the 10-tuple HashTable.cview() returns (checked: dtypes, sizes, bucket math, the
 * pool's meta), the spill lookup of keys off their home bucket, and the layout constants this build assumes. */
#include "_table.h"

static const char *const cview_fields[CV_LEN] = {"keys",   "state",  "parent", "rows", "overflow",
                                                 "nshift", "vacant", "spill",  "pool", "pmeta"};

/* layout() -> dict: the constants of _table.h, named as in kvevents/native/layout.py. */
PyObject *kv_layout(PyObject *self, PyObject *noargs) {
    PyObject *fields = PyTuple_New(CV_LEN);
    if (!fields) return NULL;
    for (int i = 0; i < CV_LEN; i++) {
        PyObject *s = PyUnicode_FromString(cview_fields[i]);
        if (!s) { Py_DECREF(fields); return NULL; }
        PyTuple_SET_ITEM(fields, i, s);
    }
    return Py_BuildValue("{sisisisisisKsKsisisKsisisisisN}", "SLOTS", KV_SLOTS, "EMPTY", KV_EMPTY, "LIVE", KV_LIVE,
                         "TOMB", KV_TOMB, "HAS_PARENT", KV_HAS_PARENT, "MIX", (unsigned long long)KV_MIX,
                         "LIVE_BYTES", (unsigned long long)KV_LIVE_BYTES, "WORD", KV_WORD, "EXTRA_ROWS",
                         KV_EXTRA_ROWS, "ROW_REF", (unsigned long long)KV_ROW_REF, "ROW_CLS_SHIFT", KV_ROW_CLS_SHIFT,
                         "POOL_CLASSES", KV_POOL_CLASSES,
                         "POOL_MIN_WORDS", KV_POOL_MIN_WORDS, "REC_SHARES_SHIFT", KV_REC_SHARES_SHIFT, "CVIEW", fields);
}

void kv_view_release(View *v) {
    if (!v->held) return;
    PyBuffer_Release(&v->kb); PyBuffer_Release(&v->sb); PyBuffer_Release(&v->pb);
    PyBuffer_Release(&v->rb); PyBuffer_Release(&v->ob); PyBuffer_Release(&v->plb); PyBuffer_Release(&v->pmb);
    v->held = 0;
}

/* The seven arrays of the view, all or none held (v->held set); 0, or -1 with ValueError. */
static int view_buffers(PyObject **it, View *v, int writable) {
    if (kv_get_buf(it[CV_KEYS], &v->kb, 8, "qlL", 0, "keys") < 0) return -1;
    if (kv_get_buf(it[CV_STATE], &v->sb, 1, "Bb?", writable, "state") < 0) goto keys;
    if (kv_get_buf(it[CV_PARENT], &v->pb, 8, "ql", writable, "parent") < 0) goto state;
    if (kv_get_buf(it[CV_ROWS], &v->rb, 8, "QL", writable, "rows") < 0) goto parent;
    if (kv_get_buf(it[CV_OVERFLOW], &v->ob, 1, "Bb?", writable, "overflow") < 0) goto rows;
    if (kv_get_buf(it[CV_POOL], &v->plb, 8, "QL", writable, "pool") < 0) goto over;
    if (kv_get_buf(it[CV_PMETA], &v->pmb, 8, "ql", writable, "pmeta") < 0) goto pool;
    v->held = 1;
    return 0;
pool:
    PyBuffer_Release(&v->plb);
over:
    PyBuffer_Release(&v->ob);
rows:
    PyBuffer_Release(&v->rb);
parent:
    PyBuffer_Release(&v->pb);
state:
    PyBuffer_Release(&v->sb);
keys:
    PyBuffer_Release(&v->kb);
    return -1;
}

/* The bucket math and array sizes agree with the keys array, the pool's meta with the pool; 0, or -1
 * with ValueError. */
static int view_check(View *v, int64_t nshift) {
    v->n = v->kb.len / 8;
    v->buckets = v->n / KV_SLOTS;
    if (v->n % KV_SLOTS || v->buckets < 2 || (v->buckets & (v->buckets - 1))) {
        PyErr_Format(PyExc_ValueError, "keys: %zd slots is not a power-of-two number (>= 2) of %d-slot buckets", v->n,
                     KV_SLOTS);
        return -1;
    }
    int lg = 0;
    while (((Py_ssize_t)1 << lg) < v->buckets) lg++;
    if (nshift != 64 - lg) {
        PyErr_Format(PyExc_ValueError, "nshift %lld does not match %zd buckets", (long long)nshift, v->buckets);
        return -1;
    }
    v->nshift = (int)nshift;
    if (v->sb.len != v->n || v->pb.len / 8 != v->n || v->ob.len < v->buckets || v->rb.len / 8 < v->n + KV_EXTRA_ROWS) {
        PyErr_SetString(PyExc_ValueError, "table arrays are shorter than the keys array implies");
        return -1;
    }
    v->npool = v->plb.len / 8;
    if (v->pmb.len / 8 != PM_LEN || v->npool < 1 || v->pmeta[PM_TOP] < 1 || v->pmeta[PM_TOP] > v->npool) {
        PyErr_SetString(PyExc_ValueError, "pool meta does not fit the pool");
        return -1;
    }
    return 0;
}

int kv_view_load(PyObject *t, View *v, int writable) {
    memset(v, 0, sizeof *v);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != CV_LEN) {
        PyErr_SetString(PyExc_ValueError, "a table view must be the 10-tuple HashTable.cview() returns");
        return -1;
    }
    PyObject **it = &PyTuple_GET_ITEM(t, 0);
    int64_t nshift;
    if (kv_as_i64(it[CV_NSHIFT], &nshift, "nshift") < 0 || kv_as_i64(it[CV_VACANT], &v->vacant, "vacant") < 0)
        return -1;
    if (!PyDict_CheckExact(it[CV_SPILL])) {
        PyErr_SetString(PyExc_ValueError, "spill must be a dict");
        return -1;
    }
    if (view_buffers(it, v, writable) < 0) return -1;
    if (writable && v->kb.readonly) {  /* keys must also be writable for apply */
        PyErr_SetString(PyExc_ValueError, "keys must be writable");
        goto bad;
    }
    v->keys = v->kb.buf; v->state = v->sb.buf; v->parent = v->pb.buf; v->rows = v->rb.buf; v->over = v->ob.buf;
    v->pool = v->plb.buf; v->pmeta = v->pmb.buf;
    v->spill = it[CV_SPILL];
    if (view_check(v, nshift) < 0) goto bad;
    return 0;
bad:
    kv_view_release(v);
    return -1;
}

Py_ssize_t kv_probe_spill(const View *v, int64_t k) {
    PyObject *key = PyLong_FromLongLong(k);
    if (!key) return -2;
    PyObject *s = PyDict_GetItemWithError(v->spill, key);
    Py_DECREF(key);
    if (!s) return PyErr_Occurred() ? -2 : -1;
    int64_t slot;
    if (kv_as_i64(s, &slot, "spill slot") < 0) return -2;
    if (slot < 0 || slot >= v->n) {
        PyErr_SetString(PyExc_ValueError, "spill slot out of range");
        return -2;
    }
    return (Py_ssize_t)slot;
}

int kv_bad_record(void) {
    PyErr_SetString(PyExc_ValueError, "a rows word names no valid pool record");
    return -1;
}
