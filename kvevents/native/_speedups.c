/* kvevents.native._speedups: the optional compiled fast path (issue 19), one extension built from the
 * C files beside this one (setup.py lists them; the module map is in kvevents/native/__init__.py).
 *
 * This file is the module: its method table, its init, and the argument helpers both twins use.
 * Every function has a pure-Python twin (kvevents/_chain.py, consumers/table.py, consumers/lookup.py,
 * consumers/copies.py) that gives identical results; kvevents/native/__init__.py picks one. Malformed
 * arguments raise ValueError. */
#include "_native.h"

/* A C-contiguous buffer of one dimension whose items are `itemsize` bytes of a struct kind in `kinds`. */
int kv_get_buf(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, const char *kinds, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, b, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a %scontiguous array", what, writable ? "writable " : "");
        return -1;
    }
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (b->itemsize != itemsize || b->ndim > 1 || strlen(f) != 1 || !strchr(kinds, f[0])) {
        PyErr_Format(PyExc_ValueError, "%s has the wrong dtype (format %s, itemsize %zd)", what,
                     b->format ? b->format : "B", b->itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* An int in int64 range, else ValueError (never OverflowError). */
int kv_as_i64(PyObject *o, int64_t *out, const char *what) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_ValueError, "%s must be an int, got %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s is not a signed 64-bit integer", what);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static PyMethodDef methods[] = {
    /* the contract's page chain (_chain.c) */
    {"chain_pages", kv_chain_pages, METH_VARARGS, "chain_pages(pages, prior) -> list of 32-byte digests"},
    {"chain_packed", kv_chain_packed, METH_VARARGS, "chain_packed(data, page_size, prior) -> concatenated digests"},
    {"digests_int64", kv_digests_int64, METH_O, "digests_int64(digests) -> native int64 bytes (the published ints)"},
    {"pack_u32", kv_pack_u32, METH_O, "pack_u32(list) -> little-endian uint32 bytes, or None (bad id)"},
    {"chain_list", kv_chain_list, METH_VARARGS, "chain_list(tokens, page_size, prior, whole) -> digests, or None (bad id)"},
    {"pack_json_u32", kv_pack_json_u32, METH_O, "pack_json_u32(text) -> uint32 bytes of a JSON id array, or None"},
    {"split_json_tokens", kv_split_json_tokens, METH_O, "split_json_tokens(body) -> (start, stop, packed ids), or None"},
    {"sha_impl", kv_sha_impl_name, METH_NOARGS, "the SHA-256 compression in use: 'sha-ni' or 'portable'"},
    {"select_sha", kv_select_sha, METH_O, "select_sha(allow_shani) -> the compression now in use"},
    /* the index walk and apply (_table.c, _walk_args.c, _walk.c, _apply.c) */
    {"layout", kv_layout, METH_NOARGS, "layout() -> the table layout constants this build assumes"},
    {"pack_layout", kv_pack_layout, METH_O, "pack_layout(layout) -> the WordLayouts packed for walk"},
    {"walk", kv_walk, METH_VARARGS, "the index walk over a plan of table views"},
    {"all_int64", kv_all_int64, METH_VARARGS, "all_int64(hashes, prev) -> every value an exact int in int64 range"},
    {"set_bits_each", kv_set_bits_each, METH_VARARGS, "the store loop of HashTable.set_bits_each"},
    {"remove_each", kv_remove_each, METH_VARARGS, "the remove loop of consumers.copies.remove_each"},
    {"store_event", kv_store_event, METH_VARARGS, "one BlockStored: checks, the parent probe and the store loop"},
    {"clear_worker", kv_clear_worker, METH_VARARGS, "the clear loop of consumers.copies.clear_worker"},
    {"cost_order", kv_cost_order, METH_VARARGS, "cost_order(cost, worker, salt) -> the rows' order by (cost, tie)"},
    {"prefix_rank", kv_prefix_rank, METH_VARARGS, "prefix_rank(have, worker, pages, scale, salt) -> the ranking without loads"},
    {"score_rows", kv_score_rows, METH_VARARGS, "the /score answer's worker dicts from the ranking's columns"},
    {"holds_bit", kv_holds_bit, METH_VARARGS, "does any view hold a key with a bit in the columns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "kvevents.native._speedups",
                                    "Optional compiled fast path (see kvevents/native/__init__.py).", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    kv_chain_init();
    if (kv_walk_init() < 0 || kv_rows_init() < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (m && kv_bound_walk_ready(m) < 0) Py_CLEAR(m);
    return m;
}
