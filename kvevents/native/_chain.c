/* The contract's page chain in C (the twin of kvevents/_chain.py): digest i = sha256(digest i-1 + page i)
 * over little-endian uint32 token pages, the packing of token lists, and the published int64 of a
 * digest. The only file that includes _sha256.h (its compression choice is per file). */
#include "_feed.h"
#include "_sha256.h"

#define CHAIN_PAGE_MAX ((Py_ssize_t)1 << 40) /* page sizes (tokens) chain_packed accepts */
#define LIST_PAGE_MAX ((Py_ssize_t)1 << 28)  /* ... and chain_list (it buffers two pages) */

void kv_chain_init(void) { kv_sha256_select(1); }

/* A page size argument: an int in 1..max, else ValueError (never OverflowError). */
static int page_size_of(PyObject *o, Py_ssize_t max, Py_ssize_t *out) {
    int64_t v;
    if (PyBool_Check(o) || kv_as_i64(o, &v, "page_size") < 0 || v < 1 || v > max) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "page_size must be an integer in 1..%zd", max);
        return -1;
    }
    *out = (Py_ssize_t)v;
    return 0;
}

/* A prior argument: None (0) or a 32-byte digest copied into `prev` (1); else ValueError (-1). */
static int prior_of(PyObject *prior, uint8_t prev[32]) {
    if (prior == Py_None) return 0;
    if (!PyBytes_Check(prior) || PyBytes_GET_SIZE(prior) != 32) {
        PyErr_SetString(PyExc_ValueError, "prior must be a 32-byte digest or None");
        return -1;
    }
    memcpy(prev, PyBytes_AS_STRING(prior), 32);
    return 1;
}

/* One link: out = sha256(prev + page), or sha256(page) for a head without a prior; prev becomes out. */
static HOT_INLINE void chain_link(uint8_t prev[32], int *have, const uint8_t *page, size_t len, uint8_t out[32]) {
#ifdef KV_HAVE_SHANI_CODE
    if (len == 64 && *have && kv_link64_fast) { kv_link64_shani(prev, page, out); return; }  /* 16 tokens */
#endif
    if (*have) kv_sha256_2(prev, 32, page, len, out);
    else kv_sha256_2(page, len, NULL, 0, out);
    memcpy(prev, out, 32);
    *have = 1;
}

/* The published int64 of a digest: its first 8 bytes, big-endian, signed. */
static inline int64_t digest_int64(const uint8_t d[32]) {
    uint64_t v = 0;
    for (int j = 0; j < 8; j++) v = (v << 8) | d[j];
    return (int64_t)v;
}

/* The chain over npages pages of `step` bytes in p (the last may be shorter: len bytes in all): each
 * digest into o (32 bytes a page) or, when o is NULL, its int64 into ints. Whole 16-token pages after
 * the first link run in one SHA-NI loop (kv_chain64_shani). */
static void chain_run(uint8_t prev[32], int have, const uint8_t *p, Py_ssize_t len, Py_ssize_t step, Py_ssize_t npages,
                      uint8_t *o, int64_t *ints) {
    uint8_t d[32];
    for (Py_ssize_t i = 0; i < npages;) {
#ifdef KV_HAVE_SHANI_CODE
        Py_ssize_t whole = len / step;
        if (have && kv_link64_fast && step == 64 && i < whole) {
            kv_chain64_shani(prev, p + 64 * i, whole - i, o ? o + 32 * i : NULL, o ? NULL : ints + i);
            i = whole;
            continue;
        }
#endif
        Py_ssize_t off = i * step, n = len - off < step ? len - off : step;
        uint8_t *dst = o ? o + 32 * i : d;
        chain_link(prev, &have, p + off, (size_t)n, dst);
        if (!o) ints[i] = digest_int64(dst);
        i++;
    }
}

/* chain_pages(pages, prior) -> list[bytes]: the chain over a sequence of page byte strings.
 * The twin of kvevents._chain.chain_digests. */
PyObject *kv_chain_pages(PyObject *self, PyObject *args) {
    PyObject *pages, *prior;
    if (!PyArg_ParseTuple(args, "OO", &pages, &prior)) return NULL;
    uint8_t prev[32];
    int have = prior_of(prior, prev);
    if (have < 0) return NULL;
    PyObject *seq = PySequence_Fast(pages, "pages must be a sequence of bytes");
    if (!seq) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "pages must be a sequence of bytes");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (!out) { Py_DECREF(seq); return NULL; }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(items[i], &b, PyBUF_SIMPLE) < 0 || PyUnicode_Check(items[i])) {
            if (!PyErr_Occurred()) PyBuffer_Release(&b);
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "page %zd is not bytes", i);
            Py_DECREF(seq); Py_DECREF(out);
            return NULL;
        }
        uint8_t d[32];
        chain_link(prev, &have, b.buf, (size_t)b.len, d);
        PyBuffer_Release(&b);
        PyObject *db = PyBytes_FromStringAndSize((const char *)d, 32);
        if (!db) { Py_DECREF(seq); Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, db);
    }
    Py_DECREF(seq);
    return out;
}

/* chain_packed(data, page_size, prior[, ints]) -> bytes: the chain over packed uint32 tokens cut into pages
 * (the last may be partial), as concatenated 32-byte digests, or (ints true) their published int64s
 * as native int64 (what digests_int64 makes of the digests). */
PyObject *kv_chain_packed(PyObject *self, PyObject *args) {
    PyObject *data, *prior, *pso;
    Py_ssize_t page_size;
    int ints = 0;
    if (!PyArg_ParseTuple(args, "OOO|p", &data, &pso, &prior, &ints)) return NULL;
    if (page_size_of(pso, CHAIN_PAGE_MAX, &page_size) < 0) return NULL;
    uint8_t prev[32];
    int have = prior_of(prior, prev);
    if (have < 0) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "packed tokens must be bytes");
        return NULL;
    }
    Py_ssize_t step = page_size * 4;
    Py_ssize_t npages = b.len / step + (b.len % step ? 1 : 0);
    PyObject *out = PyBytes_FromStringAndSize(NULL, npages * (ints ? 8 : 32));
    if (!out) { PyBuffer_Release(&b); return NULL; }
    uint8_t *o = ints ? NULL : (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *p = b.buf;
    /* The GIL is let go only for a long chain: for a request's few pages (microseconds) another
     * thread took it meanwhile and the caller waited to get it back (a /score at 256 tokens on the
     * router's event loop: 2 us of hashing, ~20 us in all). */
    PyThreadState *ts = b.len >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    chain_run(prev, have, p, b.len, step, npages, o, ints ? (int64_t *)PyBytes_AS_STRING(out) : NULL);
    if (ts) PyEval_RestoreThread(ts);
    PyBuffer_Release(&b);
    return out;
}

/* digests_int64(digests) -> bytes of native int64: each digest's first 8 bytes, big-endian, signed. */
PyObject *kv_digests_int64(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "digests must be bytes");
        return NULL;
    }
    if (b.len % 32) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "digests must be a multiple of 32 bytes");
        return NULL;
    }
    Py_ssize_t n = b.len / 32;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!out) { PyBuffer_Release(&b); return NULL; }
    const uint8_t *p = b.buf;
    int64_t *o = (int64_t *)PyBytes_AS_STRING(out);
    PyThreadState *ts = b.len >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;  /* a 4M-token request: 8 MB */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int j = 0; j < 8; j++) v = (v << 8) | p[32 * i + j];
        o[i] = (int64_t)v;
    }
    if (ts) PyEval_RestoreThread(ts);
    PyBuffer_Release(&b);
    return out;
}

/* The uint32 value of a token id object; 0, or -1 when it is not an int in 0..2**32-1 (no exception set). */
static HOT_INLINE int u32_of(PyObject *it, uint32_t *out) {
    long long v;
#if PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API)
    /* an exact int first: one compare of the type pointer, not a load of the type's flags (after a
     * cold int's own load, that second dependent load was the packing's costliest instruction) */
    if (PyLong_CheckExact(it) && (Py_SIZE(it) == 0 || Py_SIZE(it) == 1))  /* one 30-bit digit (3.11 layout) */
        v = Py_SIZE(it) ? (long long)((PyLongObject *)it)->ob_digit[0] : 0;
    else
#endif
    {
        if (!PyLong_Check(it)) return -1;
        int overflow = 0;
        v = PyLong_AsLongLongAndOverflow(it, &overflow);
        if (overflow) v = -1;
    }
    if (v < 0 || v > 0xFFFFFFFFLL) { PyErr_Clear(); return -1; }
    *out = (uint32_t)v;
    return 0;
}

/* Little-endian uint32 of list items [lo, hi) into out; 0, or -1 when one is not an int in 0..2**32-1. */
static int pack_range(PyObject *list, Py_ssize_t lo, Py_ssize_t hi, uint8_t *out) {
    for (Py_ssize_t i = lo; i < hi; i++) {
        if (i + 16 < hi) PREFETCH(PyList_GET_ITEM(list, i + 16));  /* int objects: often cold */
        uint32_t u;
        if (u32_of(PyList_GET_ITEM(list, i), &u) < 0) return -1;
        uint8_t *o = out + 4 * (i - lo);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(o, &u, 4);  /* one store (the page's 16-byte loads then forward from whole words) */
#else
        o[0] = (uint8_t)u; o[1] = (uint8_t)(u >> 8); o[2] = (uint8_t)(u >> 16); o[3] = (uint8_t)(u >> 24);
#endif
    }
    return 0;
}

/* pack_u32(list) -> bytes of little-endian uint32, or None when an item is not an int in
 * 0..2**32-1 (the Python twin, kvevents._chain.pack, then names the bad id). */
PyObject *kv_pack_u32(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(arg);
    if (n > MAX_PAGES) Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (!out) return NULL;
    if (pack_range(arg, 0, n, (uint8_t *)PyBytes_AS_STRING(out)) < 0) { Py_DECREF(out); Py_RETURN_NONE; }
    return out;
}

/* The chain over the pages of a token list, packing page p+1 while page p hashes (the chain is
 * latency-bound, packing load-bound: the CPU overlaps them); the tail past npages whole pages is only
 * validated. 0, or -1 on a bad token. */
static int chain_list_pages(PyObject *list, Py_ssize_t page_size, Py_ssize_t npages, uint8_t *buf, uint8_t prev[32],
                            int have, uint8_t *o, int64_t *ints) {
    uint8_t d[32];
    Py_ssize_t n = PyList_GET_SIZE(list);
    uint8_t *cur = buf, *next = buf + page_size * 4;
    PyObject *const *items = ((PyListObject *)list)->ob_item;
#define PAGE_HI(p) ((p) * page_size + page_size < n ? (p) * page_size + page_size : n)
    if (npages && pack_range(list, 0, PAGE_HI(0), cur) < 0) return -1;
    for (Py_ssize_t p = 0; p < npages; p++) {
        Py_ssize_t len = PAGE_HI(p) - p * page_size;
        if (p + 1 < npages && pack_range(list, (p + 1) * page_size, PAGE_HI(p + 1), next) < 0) return -1;
        for (Py_ssize_t i = (p + 16) * page_size; i < PAGE_HI(p + 16) && i < (p + 16) * page_size + 64; i += 8)
            PREFETCH(&items[i]);  /* page p+16's slots, so that the loads below of page p+8's do not miss */
        for (Py_ssize_t i = (p + 8) * page_size; i < PAGE_HI(p + 8) && i < (p + 8) * page_size + 64; i++)
            PREFETCH(items[i]);  /* page p+8's int objects load while page p hashes (~600 ns ahead: cold ints are a miss each) */
        chain_link(prev, &have, cur, (size_t)len * 4, o ? o + 32 * p : d);
        if (!o) ints[p] = digest_int64(d);
        uint8_t *t = cur; cur = next; next = t;
    }
#undef PAGE_HI
    if (npages * page_size < n && pack_range(list, npages * page_size, n, next) < 0) return -1;  /* the tail */
    return 0;
}

/* chain_list(tokens, page_size, prior, whole[, ints]) -> concatenated digests (ints: their published int64s,
 * native), or None when a token is not an int in 0..2**32-1 (the Python path then names it). whole: a
 * partial last page is only validated, not hashed. The twin of packed_chain(pack_tokens(tokens)[:whole
 * pages], ...). */
PyObject *kv_chain_list(PyObject *self, PyObject *args) {
    PyObject *list, *prior, *pso;
    Py_ssize_t page_size;
    int whole, ints = 0;
    if (!PyArg_ParseTuple(args, "OOOp|p", &list, &pso, &prior, &whole, &ints)) return NULL;
    if (page_size_of(pso, LIST_PAGE_MAX, &page_size) < 0) return NULL;
    if (!PyList_Check(list)) Py_RETURN_NONE;
    uint8_t prev[32];
    int have = prior_of(prior, prev);
    if (have < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    Py_ssize_t npages = n / page_size + (!whole && n % page_size ? 1 : 0);
    uint8_t *buf = PyMem_Malloc((size_t)page_size * 8);
    if (!buf) return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, npages * (ints ? 8 : 32));
    if (!out) { PyMem_Free(buf); return NULL; }
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    int rc = chain_list_pages(list, page_size, npages, buf, prev, have, ints ? NULL : o, ints ? (int64_t *)o : NULL);
    PyMem_Free(buf);
    if (rc < 0) { Py_DECREF(out); Py_RETURN_NONE; }
    return out;
}

/* ------------------------------------------------------------------ a chain fed a page at a time */

int kv_feed_open(KvFeed *F, PyObject *packed, PyObject *pso, PyObject *prior) {
    memset(F, 0, sizeof *F);
    if (page_size_of(pso, CHAIN_PAGE_MAX, &F->page_size) < 0) return -1;
    if ((F->have = prior_of(prior, F->prev)) < 0) return -1;
    if (PyObject_GetBuffer(packed, &F->pb, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "packed tokens must be bytes");
        return -1;
    }
    F->pb_held = 1;
    F->npages = F->pb.len / (4 * F->page_size);  /* whole pages: a partial tail is never hashed */
    return (F->out = PyBytes_FromStringAndSize(NULL, F->npages * 8)) ? 0 : -1;
}

const int64_t *kv_feed_ints(const KvFeed *F) { return (const int64_t *)PyBytes_AS_STRING(F->out); }

void kv_feed_upto(KvFeed *F, Py_ssize_t upto) {
    if (upto > F->npages) upto = F->npages;
    if (upto <= F->done) return;
    const Py_ssize_t step = 4 * F->page_size;
    chain_run(F->prev, F->have, (const uint8_t *)F->pb.buf + F->done * step, (upto - F->done) * step, step,
              upto - F->done, NULL, (int64_t *)PyBytes_AS_STRING(F->out) + F->done);
    F->have = 1;
    F->done = upto;
}

void kv_feed_close(KvFeed *F) {
    if (F->pb_held) PyBuffer_Release(&F->pb);
    F->pb_held = 0;
    Py_CLEAR(F->out);
}

PyObject *kv_sha_impl_name(PyObject *self, PyObject *noargs) { return PyUnicode_FromString(kv_sha_impl); }

PyObject *kv_select_sha(PyObject *self, PyObject *arg) {
    int allow = PyObject_IsTrue(arg);
    if (allow < 0) return NULL;
    kv_sha256_select(allow);
    return PyUnicode_FromString(kv_sha_impl);
}
