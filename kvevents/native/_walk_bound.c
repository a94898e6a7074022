/* BoundWalk: the index walk with everything but the request's hashes prepared once (kvevents.native.bind_walk).
 * At bind the bound tuple is parsed and checked, the plan's views and filters opened, the weights read, the
 * layout flattened and the scratch allocated; a call then only takes the hashes' buffer, resets the running
 * state (kv_walk_reset) and walks. Besides the ~3 us a re-parse cost per lookup, this is what a lookup after
 * an interruption pays for in cache misses: a call touches its own few arrays, not the whole argument tuple.
 *
 * The binding holds its views' buffers, so its tables' arrays live while it does (BlockIndex drops its
 * bindings when a table's arrays move). A call made while the binding is already walking (the walk can run
 * Python code: a PrefixMatch class's __init__, a finaliser during an allocation) takes the unbound path,
 * with a Walk of its own, so the shared state is never walked twice at once. */
#include "_walk.h"
#ifndef Py_T_OBJECT_EX /* before 3.12 the member kinds live in structmember.h */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *args; /* the bound 9-tuple (the Walk borrows its parts) */
    Walk W;
    int floats; /* 1: the weights are floats; 0: every call answers NotImplemented (the twin runs) */
    int busy;
} BoundWalk;

static PyObject *bw_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    BoundWalk *self = (BoundWalk *)callable;
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_ValueError, "a bound walk takes the request's hashes alone");
        return NULL;
    }
    if (self->busy) return kv_walk_once(self->args, args[0]);
    Walk *W = &self->W;
    self->busy = 1;
    int rc = kv_walk_hashes(W, args[0]);
    if (rc == 0) rc = kv_walk_run(W, self->floats);
    PyObject *out = W->result;
    W->result = NULL;
    if (rc < 0) Py_CLEAR(out);
    kv_walk_end_call(W);
    self->busy = 0;
    return out;
}

/* bound.packed(ids, page_size, prior) -> (hashes, result): the request's whole pages (ids: packed
 * little-endian uint32) hashed page by page as the walk first needs each one (kv_feed_*), so the SHA-256
 * chain and the table reads overlap. `hashes` is bytes of native int64, the chain's published hashes
 * after `prior` (what kvevents._chain.packed_chain_int64 gives for the whole pages); `result` what a
 * call with them gives. A call made while the binding is walking hashes first, then walks unbound. */
static PyObject *bw_packed(PyObject *op, PyObject *args) {
    BoundWalk *self = (BoundWalk *)op;
    PyObject *packed, *page_size, *prior;
    if (!PyArg_ParseTuple(args, "OOO", &packed, &page_size, &prior)) return NULL;
    KvFeed F;
    if (kv_feed_open(&F, packed, page_size, prior) < 0) {
        kv_feed_close(&F);
        return NULL;
    }
    PyObject *result;
    if (self->busy) {
        kv_feed_upto(&F, F.npages);
        PyObject *mv = PyMemoryView_FromObject(F.out), *q = mv ? PyObject_CallMethod(mv, "cast", "s", "q") : NULL;
        result = q ? kv_walk_once(self->args, q) : NULL; /* the hashes as int64 items, as a call takes them */
        Py_XDECREF(q);
        Py_XDECREF(mv);
    } else {
        Walk *W = &self->W;
        self->busy = 1;
        W->q = kv_feed_ints(&F);
        W->n = F.npages;
        W->feed = &F;
        int rc = kv_walk_run(W, self->floats);
        kv_feed_upto(&F, F.npages); /* the pages past the walk's end, or all of them when it did not walk */
        result = W->result;
        W->result = NULL;
        W->feed = NULL;
        kv_walk_end_call(W);
        self->busy = 0;
        if (rc < 0) Py_CLEAR(result);
    }
    PyObject *out = result ? PyTuple_Pack(2, F.out, result) : NULL;
    Py_XDECREF(result);
    kv_feed_close(&F);
    return out;
}

static PyMethodDef bw_methods[] = {
    {"packed", bw_packed, METH_VARARGS, "packed(ids, page_size, prior) -> (hashes, result): hash and walk at once"},
    {NULL, NULL, 0, NULL},
};

static PyObject *bw_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *bound;
    if ((kwargs && PyDict_GET_SIZE(kwargs)) || PyTuple_GET_SIZE(args) != 1 || !PyTuple_Check(bound = PyTuple_GET_ITEM(args, 0)) ||
        PyTuple_GET_SIZE(bound) != 9) {
        PyErr_SetString(PyExc_ValueError, "BoundWalk takes one tuple: the 9 bound walk arguments");
        return NULL;
    }
    BoundWalk *self = (BoundWalk *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    kv_walk_zero(&self->W);
    self->vectorcall = bw_vectorcall;
    self->args = Py_NewRef(bound);
    int ready = kv_walk_parse_bound(&self->W, bound) < 0 ? -1 : kv_walk_prepare(&self->W);
    if (ready < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->floats = ready;
    return (PyObject *)self;
}

static void bw_dealloc(PyObject *op) {
    BoundWalk *self = (BoundWalk *)op;
    kv_walk_free(&self->W);
    Py_XDECREF(self->args);
    Py_TYPE(op)->tp_free(op);
}

static PyMemberDef bw_members[] = {
    {"args", Py_T_OBJECT_EX, offsetof(BoundWalk, args), Py_READONLY, "the bound walk arguments"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BoundWalkType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvevents.native._speedups.BoundWalk",
    .tp_basicsize = sizeof(BoundWalk),
    .tp_dealloc = bw_dealloc,
    .tp_vectorcall_offset = offsetof(BoundWalk, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "BoundWalk(bound) -> a callable of the request's hashes: the index walk prepared once",
    .tp_members = bw_members,
    .tp_methods = bw_methods,
    .tp_new = bw_new,
};

int kv_bound_walk_ready(PyObject *module) {
    if (PyType_Ready(&BoundWalkType) < 0) return -1;
    Py_INCREF(&BoundWalkType);
    if (PyModule_AddObject(module, "BoundWalk", (PyObject *)&BoundWalkType) < 0) {
        Py_DECREF(&BoundWalkType);
        return -1;
    }
    return 0;
}
