/* The walk's layout, packed once: a list of WordLayouts (word, cols [(column, medium index)...], alive)
 * checked and flattened into one bytes object of int64s (format: _walk.h), which a bound walk passes to
 * every lookup, so a lookup never reads a WordLayout attribute (at 4,096 workers: 128 words, ~13 us). */
#include "_walk.h"

static PyObject *s_cols, *s_word, *s_alive;

int kv_layout_init(void) {
    return (s_cols = PyUnicode_InternFromString("cols")) && (s_word = PyUnicode_InternFromString("word")) &&
                   (s_alive = PyUnicode_InternFromString("alive"))
               ? 0
               : -1;
}

/* A packed layout's word count, its sizes and starts checked (-1 with ValueError when they do not fit). */
Py_ssize_t kv_layout_words(PyObject *packed) {
    Py_ssize_t len = PyBytes_GET_SIZE(packed) / 8;
    const int64_t *L = (const int64_t *)PyBytes_AS_STRING(packed);
    if (PyBytes_GET_SIZE(packed) % 8 || len < LAY_HEAD) goto bad;
    int64_t nw = L[LAY_NW], ntot = L[LAY_NTOT];
    if (nw < 0 || ntot < nw || nw > len || ntot > len || LAY_HEAD + 3 * nw + 1 + 2 * ntot != len) goto bad;
    const int64_t *alive = L + LAY_HEAD + nw, *start = alive + nw;
    for (int64_t w = 0; w < nw; w++)
        if ((uint64_t)alive[w] > KV_LOW || start[w] < 0 || start[w + 1] <= start[w] || L[LAY_HEAD + w] < 0 ||
            L[LAY_HEAD + w] > ((int64_t)1 << 40))
            goto bad;
    if ((nw && start[0] != 0) || start[nw] != ntot) goto bad;
    return (Py_ssize_t)nw;
bad:
    PyErr_SetString(PyExc_ValueError, "a packed layout must come from pack_layout");
    return -1;
}

/* (word, alive) of one WordLayout into out[0..1]; its cols list (a new ref) in *cols. 0, or -1. */
static int word_head(PyObject *lay, int64_t out[2], PyObject **cols) {
    PyObject *word = PyObject_GetAttr(lay, s_word), *alive = word ? PyObject_GetAttr(lay, s_alive) : NULL;
    *cols = alive ? PyObject_GetAttr(lay, s_cols) : NULL;
    int bad = !*cols;
    if (!bad && (kv_as_i64(word, &out[0], "WordLayout.word") < 0 || out[0] < 0 || out[0] > ((int64_t)1 << 40))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "WordLayout.word out of range");
        bad = 1;
    }
    if (!bad) {
        uint64_t a = PyLong_Check(alive) ? PyLong_AsUnsignedLongLong(alive) : (uint64_t)-1;
        if (PyErr_Occurred() || a > KV_LOW) { PyErr_Clear(); PyErr_SetString(PyExc_ValueError, "WordLayout.alive must be a 32-bit mask"); bad = 1; }
        out[1] = (int64_t)a;
    }
    if (!bad && (!PyList_Check(*cols) || PyList_GET_SIZE(*cols) < 1)) {
        PyErr_SetString(PyExc_ValueError, "WordLayout.cols must be a non-empty list");
        bad = 1;
    }
    Py_XDECREF(word); Py_XDECREF(alive);
    if (bad) Py_CLEAR(*cols);
    return bad ? -1 : 0;
}

/* One (column, medium index) entry into cm[0..1]. 0, or -1 with ValueError. */
static int col_entry(PyObject *pair, int64_t cm[2]) {
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || kv_as_i64(PyTuple_GET_ITEM(pair, 0), &cm[0], "column") < 0 ||
        kv_as_i64(PyTuple_GET_ITEM(pair, 1), &cm[1], "medium index") < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "WordLayout.cols entries must be (column, medium index)");
        return -1;
    }
    if (cm[0] < 0 || cm[0] >= MAX_WALK_COLUMNS || cm[1] < 0) {
        PyErr_SetString(PyExc_ValueError, "layout column or medium index out of range");
        return -1;
    }
    return 0;
}

/* pack_layout(layout) -> bytes: the list of WordLayouts, checked and packed (see _walk.h). */
PyObject *kv_pack_layout(PyObject *self, PyObject *layout) {
    if (!PyList_Check(layout)) { PyErr_SetString(PyExc_ValueError, "layout must be a list of WordLayout"); return NULL; }
    Py_ssize_t nw = PyList_GET_SIZE(layout), ntot = 0, cap = 16;
    int64_t *head = PyMem_Calloc((size_t)(3 * nw + 1) + 1, sizeof(int64_t)), *cm = PyMem_Malloc((size_t)cap * 2 * 8);
    PyObject *out = NULL;
    if (!head || !cm) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t w = 0; w < nw; w++) {
        int64_t wa[2];
        PyObject *cols;
        if (word_head(PyList_GET_ITEM(layout, w), wa, &cols) < 0) goto done;
        head[w] = wa[0];
        head[nw + w] = wa[1];
        head[2 * nw + w] = ntot;
        for (Py_ssize_t c = 0; c < PyList_GET_SIZE(cols); c++, ntot++) {
            if (ntot == cap) {
                int64_t *more = PyMem_Realloc(cm, (size_t)(cap *= 2) * 2 * 8);
                if (!more) { Py_DECREF(cols); PyErr_NoMemory(); goto done; }
                cm = more;
            }
            if (col_entry(PyList_GET_ITEM(cols, c), cm + 2 * ntot) < 0) { Py_DECREF(cols); goto done; }
        }
        Py_DECREF(cols);
    }
    head[3 * nw] = ntot;
    out = PyBytes_FromStringAndSize(NULL, (LAY_HEAD + 3 * nw + 1 + 2 * ntot) * 8);
    if (!out) goto done;
    int64_t *L = (int64_t *)PyBytes_AS_STRING(out);
    L[LAY_NW] = nw;
    L[LAY_NTOT] = ntot;
    memcpy(L + LAY_HEAD, head, (size_t)(3 * nw + 1) * 8);
    for (Py_ssize_t c = 0; c < ntot; c++) {
        L[LAY_HEAD + 3 * nw + 1 + c] = cm[2 * c];
        L[LAY_HEAD + 3 * nw + 1 + ntot + c] = cm[2 * c + 1];
    }
done:
    PyMem_Free(head); PyMem_Free(cm);
    return out;
}
