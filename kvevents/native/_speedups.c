/* kvevents.native._speedups: the optional compiled fast path (issue 19).
 *
 * Three loops that the pure-Python code runs per page: the SHA-256 page chain, the index walk over
 * a HashTable's arrays (probe, OR the views, AND down the pages per worker word, per-medium
 * credit), and the store/remove apply loops. Every function here has a pure-Python twin
 * (kvevents/hashing.py, consumers/table.py, consumers/lookup.py, consumers/copies.py) that gives
 * identical results; kvevents/native/__init__.py picks one. Malformed arguments raise ValueError. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#ifndef Py_T_OBJECT_EX /* before 3.12 the member kinds live in structmember.h */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif
#include <string.h>

#include "_sha256.h"

#define SLOTS 8
#define ST_LIVE 1
#define ST_TOMB 2
#define ST_HAS_PARENT 4
#define MIX 0x9E3779B97F4A7C15ULL
#define LIVE_BYTES 0x0101010101010101ULL
#define MAX_PAGES ((Py_ssize_t)1 << 40)
#define RELEASE_GIL_BYTES ((Py_ssize_t)1 << 20) /* chain_packed lets the GIL go from 1 MiB (~2.5 ms of SHA-256) */

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 3)
#define HOT_INLINE inline __attribute__((always_inline))
#define COLD __attribute__((noinline, cold))
#define CTZ64(x) __builtin_ctzll(x)
#else
#define PREFETCH(p) ((void)0)
#define HOT_INLINE inline
#define COLD
static int CTZ64(uint64_t x) { int n = 0; while (!(x & 1)) { x >>= 1; n++; } return n; }
#endif

/* ------------------------------------------------------------------ buffers */

static int get_buf(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, const char *kinds, int writable,
                   const char *what) {
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

static int as_i64(PyObject *o, int64_t *out, const char *what) {
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

/* ------------------------------------------------------------------ page chain */

/* A page size argument: an int in 1..max, else ValueError (never OverflowError). */
static int page_size_of(PyObject *o, Py_ssize_t max, Py_ssize_t *out) {
    int64_t v;
    if (PyBool_Check(o) || as_i64(o, &v, "page_size") < 0 || v < 1 || v > max) {
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

/* chain_pages(pages, prior) -> list[bytes]: digest i = sha256(digest i-1 + page i) (or of page 0
 * alone without a prior). The twin of kvevents.hashing._digests. */
static PyObject *chain_pages(PyObject *self, PyObject *args) {
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
        if (have) kv_sha256_2(prev, 32, b.buf, (size_t)b.len, d);
        else kv_sha256_2(b.buf, (size_t)b.len, NULL, 0, d);
        PyBuffer_Release(&b);
        memcpy(prev, d, 32);
        have = 1;
        PyObject *db = PyBytes_FromStringAndSize((const char *)d, 32);
        if (!db) { Py_DECREF(seq); Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, db);
    }
    Py_DECREF(seq);
    return out;
}

/* chain_packed(data, page_size, prior) -> bytes: the chain over packed uint32 tokens cut into pages
 * (the last may be partial), as concatenated 32-byte digests. */
static PyObject *chain_packed(PyObject *self, PyObject *args) {
    PyObject *data, *prior, *pso;
    Py_ssize_t page_size;
    if (!PyArg_ParseTuple(args, "OOO", &data, &pso, &prior)) return NULL;
    if (page_size_of(pso, (Py_ssize_t)1 << 40, &page_size) < 0) return NULL;
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
    PyObject *out = PyBytes_FromStringAndSize(NULL, npages * 32);
    if (!out) { PyBuffer_Release(&b); return NULL; }
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *p = b.buf;
    /* The GIL is let go only for a long chain: for a request's few pages (microseconds) another
     * thread took it meanwhile and the caller waited to get it back (a /score at 256 tokens on the
     * router's event loop: 2 us of hashing, ~20 us in all). */
    PyThreadState *ts = b.len >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < npages; i++) {
        Py_ssize_t off = i * step, len = b.len - off < step ? b.len - off : step;
        if (have) kv_sha256_2(prev, 32, p + off, (size_t)len, o + 32 * i);
        else kv_sha256_2(p + off, (size_t)len, NULL, 0, o + 32 * i);
        memcpy(prev, o + 32 * i, 32);
        have = 1;
    }
    if (ts) PyEval_RestoreThread(ts);
    PyBuffer_Release(&b);
    return out;
}

/* digests_int64(digests) -> bytes of native int64: each digest's first 8 bytes, big-endian, signed. */
static PyObject *digests_int64(PyObject *self, PyObject *arg) {
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

/* pack_u32(list) -> bytes of little-endian uint32, or None when an item is not an int in
 * 0..2**32-1 (the Python twin, kvevents.hashing.pack_tokens, then names the bad id). */
static PyObject *pack_u32(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(arg);
    if (n > MAX_PAGES) Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (!out) return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(arg) && i < n; i++) {
        PyObject *it = PyList_GET_ITEM(arg, i);
        if (i + 16 < n) PREFETCH(PyList_GET_ITEM(arg, i + 16));  /* int objects: often cold */
        if (!PyLong_Check(it)) { Py_DECREF(out); Py_RETURN_NONE; }
        long long v;
#if PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API)
        if (PyLong_CheckExact(it) && (Py_SIZE(it) == 0 || Py_SIZE(it) == 1))  /* one 30-bit digit (3.11 layout) */
            v = Py_SIZE(it) ? (long long)((PyLongObject *)it)->ob_digit[0] : 0;
        else
#endif
        {
            int overflow = 0;
            v = PyLong_AsLongLongAndOverflow(it, &overflow);
            if (overflow) v = -1;
        }
        if (v < 0 || v > 0xFFFFFFFFLL) { PyErr_Clear(); Py_DECREF(out); Py_RETURN_NONE; }
        uint32_t u = (uint32_t)v;
        o[4 * i] = (uint8_t)u; o[4 * i + 1] = (uint8_t)(u >> 8); o[4 * i + 2] = (uint8_t)(u >> 16); o[4 * i + 3] = (uint8_t)(u >> 24);
    }
    if (PyList_GET_SIZE(arg) != n) { Py_DECREF(out); Py_RETURN_NONE; }
    return out;
}

/* Little-endian uint32 of list items [lo, hi) into out; 0, or -1 when one is not an int in 0..2**32-1. */
static int pack_range(PyObject *list, Py_ssize_t lo, Py_ssize_t hi, uint8_t *out) {
    for (Py_ssize_t i = lo; i < hi; i++) {
        PyObject *it = PyList_GET_ITEM(list, i);
        if (i + 16 < hi) PREFETCH(PyList_GET_ITEM(list, i + 16));
        if (!PyLong_Check(it)) return -1;
        long long v;
#if PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API)
        if (PyLong_CheckExact(it) && (Py_SIZE(it) == 0 || Py_SIZE(it) == 1))
            v = Py_SIZE(it) ? (long long)((PyLongObject *)it)->ob_digit[0] : 0;
        else
#endif
        {
            int overflow = 0;
            v = PyLong_AsLongLongAndOverflow(it, &overflow);
            if (overflow) v = -1;
        }
        if (v < 0 || v > 0xFFFFFFFFLL) { PyErr_Clear(); return -1; }
        uint32_t u = (uint32_t)v;
        uint8_t *o = out + 4 * (i - lo);
        o[0] = (uint8_t)u; o[1] = (uint8_t)(u >> 8); o[2] = (uint8_t)(u >> 16); o[3] = (uint8_t)(u >> 24);
    }
    return 0;
}

/* chain_list(tokens, page_size, prior, whole) -> concatenated digests, or None when a token is not an
 * int in 0..2**32-1 (the Python path then names it). Packs page i+1 while page i hashes (the chain is
 * latency-bound, packing load-bound: the CPU overlaps them). whole: a partial last page is only
 * validated, not hashed. The twin of packed_chain(pack_tokens(tokens)[:whole pages], ...). */
static PyObject *chain_list(PyObject *self, PyObject *args) {
    PyObject *list, *prior, *pso;
    Py_ssize_t page_size;
    int whole;
    if (!PyArg_ParseTuple(args, "OOOp", &list, &pso, &prior, &whole)) return NULL;
    if (page_size_of(pso, (Py_ssize_t)1 << 28, &page_size) < 0) return NULL;
    if (!PyList_Check(list)) Py_RETURN_NONE;
    uint8_t prev[32];
    int have = prior_of(prior, prev);
    if (have < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    Py_ssize_t npages = n / page_size + (!whole && n % page_size ? 1 : 0);
    uint8_t *buf = PyMem_Malloc((size_t)page_size * 8);
    if (!buf) return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, npages * 32);
    if (!out) { PyMem_Free(buf); return NULL; }
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    uint8_t *cur = buf, *next = buf + page_size * 4;
    #define PAGE_HI(p) ((p) * page_size + page_size < n ? (p) * page_size + page_size : n)
    if (npages && pack_range(list, 0, PAGE_HI(0), cur) < 0) goto bad;
    for (Py_ssize_t p = 0; p < npages; p++) {
        Py_ssize_t len = PAGE_HI(p) - p * page_size;
        if (p + 1 < npages && pack_range(list, (p + 1) * page_size, PAGE_HI(p + 1), next) < 0) goto bad;
        for (Py_ssize_t i = (p + 2) * page_size; i < PAGE_HI(p + 2) && i < (p + 2) * page_size + 64; i++)
            PREFETCH(PyList_GET_ITEM(list, i));  /* page p+2's int objects load while page p hashes */
        if (have) kv_sha256_2(prev, 32, cur, (size_t)len * 4, o + 32 * p);
        else kv_sha256_2(cur, (size_t)len * 4, NULL, 0, o + 32 * p);
        memcpy(prev, o + 32 * p, 32);
        have = 1;
        uint8_t *t = cur; cur = next; next = t;
    }
    if (npages * page_size < n && pack_range(list, npages * page_size, n, next) < 0) goto bad;  /* the tail: validated */
    #undef PAGE_HI
    PyMem_Free(buf);
    return out;
bad:
    PyMem_Free(buf);
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* The JSON id array at p ('[' ids ']' with JSON whitespace, each id plain digits: no sign, fraction,
 * exponent or leading zero, 0..2**32-1) packed as little-endian uint32 into o; the pointer past its
 * ']' and *n ids, or NULL when the text there is not exactly that. Touches no Python object (runs
 * without the GIL). */
#define JSON_WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')
static const uint8_t *pack_ids(const uint8_t *p, const uint8_t *end, uint8_t *o, Py_ssize_t *n) {
    *n = 0;
    if (p == end || *p++ != '[') return NULL;
    while (p < end && JSON_WS(*p)) p++;
    if (p < end && *p == ']') return p + 1;
    for (;;) {
        if (p == end || *p < '0' || *p > '9') return NULL;
        uint64_t v = (uint64_t)(*p++ - '0');
        if (v == 0 && p < end && *p >= '0' && *p <= '9') return NULL; /* a leading zero */
        int digits = 1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (++digits > 10) return NULL;
            v = v * 10 + (uint64_t)(*p++ - '0');
        }
        if (v > 0xFFFFFFFFULL) return NULL;
        o[0] = (uint8_t)v; o[1] = (uint8_t)(v >> 8); o[2] = (uint8_t)(v >> 16); o[3] = (uint8_t)(v >> 24);
        o += 4;
        (*n)++;
        while (p < end && JSON_WS(*p)) p++;
        if (p == end) return NULL;
        if (*p == ']') return p + 1;
        if (*p++ != ',') return NULL;
        while (p < end && JSON_WS(*p)) p++;
    }
}

/* pack_json_u32(text) -> little-endian uint32 bytes of a JSON array of token ids (pack_ids' form,
 * JSON whitespace around it), or None unless the text is exactly that. The /score body's tokens,
 * read without an int object per id; anything else (None) is decoded the usual way, which accepts
 * or names it. The twin of consumers.score_body.pack_json_ids_py. */
static PyObject *pack_json_u32(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "pack_json_u32 needs a bytes-like object");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)b.buf, *end = p + b.len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (b.len / 2 + 1) * 4); /* ids <= (len + 1) / 2 */
    if (!out) { PyBuffer_Release(&b); return NULL; }
    Py_ssize_t n = 0;
    PyThreadState *ts = b.len >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    while (p < end && JSON_WS(*p)) p++;
    p = pack_ids(p, end, (uint8_t *)PyBytes_AS_STRING(out), &n);
    while (p && p < end && JSON_WS(*p)) p++;
    if (ts) PyEval_RestoreThread(ts);
    PyBuffer_Release(&b);
    if (p != end) { Py_DECREF(out); Py_RETURN_NONE; }
    if (_PyBytes_Resize(&out, n * 4) < 0) return NULL;
    return out;
}

/* Past the JSON string at p (its opening '"'), or NULL unterminated; *escaped set on a backslash. */
static const uint8_t *skip_string(const uint8_t *p, const uint8_t *end, int *escaped) {
    for (p++; p < end; p++) {
        if (*p == '"') return p + 1;
        if (*p == '\\') { *escaped = 1; p++; }
    }
    return NULL;
}

/* Past the JSON value at p, or NULL when its brackets do not match (or nest over 64 deep). Only the
 * structure is followed: strings, brackets, scalars up to a delimiter; what the value says is left
 * to the decoder of the body's other fields. */
static const uint8_t *skip_value(const uint8_t *p, const uint8_t *end) {
    char stack[64];
    int depth = 0, escaped = 0;
    do {
        if (p == end) return NULL;
        uint8_t c = *p;
        if (c == '"') {
            if (!(p = skip_string(p, end, &escaped))) return NULL;
        } else if (c == '{' || c == '[') {
            if (depth == 64) return NULL;
            stack[depth++] = (char)(c == '{' ? '}' : ']');
            p++;
        } else if (c == '}' || c == ']') {
            if (!depth || stack[--depth] != (char)c) return NULL;
            p++;
        } else if (depth) {
            p++;  /* a scalar, ':' or ',' inside a container */
        } else {  /* a scalar at the top: up to the next delimiter */
            while (p < end && *p != ',' && *p != '}' && *p != ']' && !JSON_WS(*p)) p++;
        }
    } while (depth);
    return p;
}

/* The top-level "tokens" array of the JSON object in [p, end): its span [*start, *stop) and ids
 * packed into o; 0, or -1 unless the text is an object whose keys are plain (no escape), with one
 * "tokens" key whose value is pack_ids' form. No Python object is touched. */
static int find_tokens(const uint8_t *base, const uint8_t *end, uint8_t *o, Py_ssize_t *n, Py_ssize_t *start,
                       Py_ssize_t *stop) {
    const uint8_t *p = base;
    int found = 0;
    while (p < end && JSON_WS(*p)) p++;
    if (p == end || *p++ != '{') return -1;
    while (p < end && JSON_WS(*p)) p++;
    if (p < end && *p == '}') return -1;
    for (;;) {
        int escaped = 0;
        if (p == end || *p != '"') return -1;
        const uint8_t *key = p + 1, *after = skip_string(p, end, &escaped);
        if (!after || escaped) return -1;
        int is_tokens = after - key == 7 && memcmp(key, "tokens", 6) == 0;
        p = after;
        while (p < end && JSON_WS(*p)) p++;
        if (p == end || *p++ != ':') return -1;
        while (p < end && JSON_WS(*p)) p++;
        if (is_tokens) {
            if (found++) return -1;  /* a second "tokens": the decoder decides */
            *start = p - base;
            if (!(p = pack_ids(p, end, o, n))) return -1;
            *stop = p - base;
        } else if (!(p = skip_value(p, end))) {
            return -1;
        }
        while (p < end && JSON_WS(*p)) p++;
        if (p == end) return -1;
        if (*p == '}') break;
        if (*p++ != ',') return -1;
        while (p < end && JSON_WS(*p)) p++;
    }
    for (p++; p < end && JSON_WS(*p); p++) {
    }
    return found && p == end ? 0 : -1;
}

/* split_json_tokens(body) -> (start, stop, packed) or None: the span of a /score body's top-level
 * "tokens" array and its ids as little-endian uint32 (find_tokens' rules), so the other fields can
 * be decoded from body[:start] + b"[]" + body[stop:] and the ids never become int objects. A long
 * body is read with the GIL let go (the router's event loop serves meanwhile). The twin of
 * consumers.score_body.split_json_tokens_py. */
static PyObject *split_json_tokens(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "split_json_tokens needs a bytes-like object");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)b.buf;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (b.len / 2 + 1) * 4);  /* ids <= (len + 1) / 2 */
    if (!out) { PyBuffer_Release(&b); return NULL; }
    Py_ssize_t n = 0, start = 0, stop = 0;
    PyThreadState *ts = b.len >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    int rc = find_tokens(p, p + b.len, (uint8_t *)PyBytes_AS_STRING(out), &n, &start, &stop);
    if (ts) PyEval_RestoreThread(ts);
    PyBuffer_Release(&b);
    if (rc < 0) { Py_DECREF(out); Py_RETURN_NONE; }
    if (_PyBytes_Resize(&out, n * 4) < 0) return NULL;
    PyObject *res = Py_BuildValue("nnN", start, stop, out);
    return res;
}
#undef JSON_WS

/* all_int64(hashes, prev) -> bool: every hash (and prev, unless None) an exact int in int64 range. */
static PyObject *all_int64(PyObject *self, PyObject *args) {
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

static PyObject *sha_impl(PyObject *self, PyObject *noargs) { return PyUnicode_FromString(kv_sha_impl); }

static PyObject *select_sha(PyObject *self, PyObject *arg) {
    int allow = PyObject_IsTrue(arg);
    if (allow < 0) return NULL;
    kv_sha256_select(allow);
    return PyUnicode_FromString(kv_sha_impl);
}

/* ------------------------------------------------------------------ table views */

/* A HashTable's arrays, as HashTable.cview() hands them over:
 * (keys int64[n], state uint8[n], parent int64[n], masks uint64[(n+1)*nc], overflow uint8[n/8],
 *  nshift, vacant, spill dict, nc). */
typedef struct {
    Py_buffer kb, sb, pb, mb, ob;
    int64_t *keys;
    uint8_t *state;
    int64_t *parent;
    uint64_t *masks;
    uint8_t *over;
    Py_ssize_t n, buckets, nc;
    int nshift;
    int64_t vacant;
    PyObject *spill;
    int held;
} View;

static void view_release(View *v) {
    if (!v->held) return;
    PyBuffer_Release(&v->kb); PyBuffer_Release(&v->sb); PyBuffer_Release(&v->pb);
    PyBuffer_Release(&v->mb); PyBuffer_Release(&v->ob);
    v->held = 0;
}

static int view_load(PyObject *t, View *v, int writable) {
    memset(v, 0, sizeof *v);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 9) {
        PyErr_SetString(PyExc_ValueError, "a table view must be the 9-tuple HashTable.cview() returns");
        return -1;
    }
    PyObject **it = &PyTuple_GET_ITEM(t, 0);
    int64_t nshift, nc;
    if (as_i64(it[5], &nshift, "nshift") < 0 || as_i64(it[6], &v->vacant, "vacant") < 0 ||
        as_i64(it[8], &nc, "nc") < 0)
        return -1;
    if (!PyDict_CheckExact(it[7])) {
        PyErr_SetString(PyExc_ValueError, "spill must be a dict");
        return -1;
    }
    if (get_buf(it[0], &v->kb, 8, "qlL", 0, "keys") < 0) return -1;
    if (get_buf(it[1], &v->sb, 1, "Bb?", writable, "state") < 0) { PyBuffer_Release(&v->kb); return -1; }
    if (get_buf(it[2], &v->pb, 8, "ql", writable, "parent") < 0) {
        PyBuffer_Release(&v->kb); PyBuffer_Release(&v->sb); return -1;
    }
    if (get_buf(it[3], &v->mb, 8, "QL", writable, "masks") < 0) {
        PyBuffer_Release(&v->kb); PyBuffer_Release(&v->sb); PyBuffer_Release(&v->pb); return -1;
    }
    if (get_buf(it[4], &v->ob, 1, "Bb?", writable, "overflow") < 0) {
        PyBuffer_Release(&v->kb); PyBuffer_Release(&v->sb); PyBuffer_Release(&v->pb); PyBuffer_Release(&v->mb);
        return -1;
    }
    v->held = 1;
    /* keys must also be writable for apply: a read-only keys buffer is refused there */
    if (writable && v->kb.readonly) {
        PyErr_SetString(PyExc_ValueError, "keys must be writable");
        goto bad;
    }
    v->keys = v->kb.buf; v->state = v->sb.buf; v->parent = v->pb.buf; v->masks = v->mb.buf; v->over = v->ob.buf;
    v->n = v->kb.len / 8;
    v->nc = (Py_ssize_t)nc;
    v->spill = it[7];
    v->buckets = v->n / SLOTS;
    if (v->n % SLOTS || v->buckets < 2 || (v->buckets & (v->buckets - 1))) {
        PyErr_Format(PyExc_ValueError, "keys: %zd slots is not a power-of-two number (>= 2) of 8-slot buckets", v->n);
        goto bad;
    }
    int lg = 0;
    while (((Py_ssize_t)1 << lg) < v->buckets) lg++;
    if (nshift != 64 - lg) {
        PyErr_Format(PyExc_ValueError, "nshift %lld does not match %zd buckets", (long long)nshift, v->buckets);
        goto bad;
    }
    v->nshift = (int)nshift;
    if (nc < 1 || nc > 65536) {
        PyErr_Format(PyExc_ValueError, "nc must be in 1..65536, got %lld", (long long)nc);
        goto bad;
    }
    if (v->sb.len != v->n || v->pb.len / 8 != v->n || v->ob.len < v->buckets || v->mb.len / 8 < (v->n + 1) * v->nc) {
        PyErr_SetString(PyExc_ValueError, "table arrays are shorter than the keys array implies");
        goto bad;
    }
    return 0;
bad:
    view_release(v);
    return -1;
}

static inline Py_ssize_t home_of(const View *v, int64_t k) {
    return (Py_ssize_t)(((uint64_t)k * MIX) >> v->nshift);
}

/* The slot of a key off its home bucket, from the spill dict; -1 absent, -2 error. */
static COLD Py_ssize_t probe_spill(const View *v, int64_t k) {
    PyObject *key = PyLong_FromLongLong(k);
    if (!key) return -2;
    PyObject *s = PyDict_GetItemWithError(v->spill, key);
    Py_DECREF(key);
    if (!s) return PyErr_Occurred() ? -2 : -1;
    int64_t slot;
    if (as_i64(s, &slot, "spill slot") < 0) return -2;
    if (slot < 0 || slot >= v->n) {
        PyErr_SetString(PyExc_ValueError, "spill slot out of range");
        return -2;
    }
    return (Py_ssize_t)slot;
}

/* The slot of key k in its home bucket (b), else via the spill dict, else -1 (-2 on error). */
static HOT_INLINE Py_ssize_t probe(const View *v, int64_t k, Py_ssize_t b) {
    const int64_t *row = v->keys + b * SLOTS;
    unsigned hit = 0;
    for (int j = 0; j < SLOTS; j++) hit |= (unsigned)(row[j] == k) << j;  /* branch-free compare */
    if (hit && k != v->vacant) return b * SLOTS + CTZ64(hit);
    if (k == v->vacant || !v->over[b] || !PyDict_GET_SIZE(v->spill)) return -1;
    return probe_spill(v, k);
}

/* ------------------------------------------------------------------ the walk */

#define BLOCK 16
#define MAX_VIEWS 64

/* attribute names, interned once (a C-string attribute lookup builds a str per call) */
static PyObject *s_cols, *s_word, *s_alive, *s_workers;

/* walk(hashes, plan, layout, media, weights, PrefixMatch, WorkerMatch, builtin sum) -> PrefixMatch
 * plan: list of (cview, filter uint64[nc] or None); layout: list of WordLayout (word, cols, alive).
 * The twin of: masks = OR over the plan of t.rows(hashes) & filter; consumers.lookup.walk(masks, ...). */
static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *hashes, *plan, *layout, *media, *weights, *pm_cls, *wm_cls, *sum_fn, *wm_fields = NULL, *pm_fields = NULL;
    Py_ssize_t wm_off[3] = {0, 0, 0};
    PyObject *last_pg = NULL, *last_score = NULL;  /* shared by consecutive workers with the same match */
    long long last_pages = -1;
    Py_ssize_t last_mi = -1;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!OOO|OO", &hashes, &PyList_Type, &plan, &PyList_Type, &layout, &PyList_Type,
                          &media, &PyList_Type, &weights, &pm_cls, &wm_cls, &sum_fn, &wm_fields, &pm_fields))
        return NULL;
    if (wm_fields == Py_None) wm_fields = NULL;
    if (pm_fields == Py_None) pm_fields = NULL;
    if (pm_fields) {  /* (pages, workers) slot descriptors of pm_cls */
        int ok = PyType_Check(pm_cls) && PyTuple_Check(pm_fields) && PyTuple_GET_SIZE(pm_fields) == 2;
        for (int f = 0; ok && f < 2; f++) {
            PyObject *d = PyTuple_GET_ITEM(pm_fields, f);
            ok = Py_TYPE(d) == &PyMemberDescr_Type && PyDescr_TYPE(d) == (PyTypeObject *)pm_cls;
        }
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "pm_fields must be the 2 slot descriptors of the PrefixMatch class");
            return NULL;
        }
    }
    if (wm_fields) {  /* (pages, score, pages_by_medium) slot descriptors of wm_cls, in __init__ order */
        int ok = PyType_Check(wm_cls) && PyTuple_Check(wm_fields) && PyTuple_GET_SIZE(wm_fields) == 3;
        for (int f = 0; ok && f < 3; f++) {
            PyObject *d = PyTuple_GET_ITEM(wm_fields, f);
            ok = Py_TYPE(d) == &PyMemberDescr_Type && PyDescr_TYPE(d) == (PyTypeObject *)wm_cls;
            if (ok) {  /* a writable object slot: the result's fields are stored at its offset */
                PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
                ok = md->type == Py_T_OBJECT_EX && !(md->flags & Py_READONLY) && md->offset >= (Py_ssize_t)sizeof(PyObject) &&
                     md->offset + (Py_ssize_t)sizeof(PyObject *) <= ((PyTypeObject *)wm_cls)->tp_basicsize;
                wm_off[f] = md->offset;
            }
        }
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "wm_fields must be the 3 slot descriptors of the WorkerMatch class");
            return NULL;
        }
    }
    Py_buffer hb;
    if (get_buf(hashes, &hb, 8, "ql", 0, "hashes") < 0) return NULL;
    const int64_t *q = hb.buf;
    Py_ssize_t n = hb.len / 8;
    Py_ssize_t nv = PyList_GET_SIZE(plan), nw = PyList_GET_SIZE(layout), nmedia = PyList_GET_SIZE(media);
    PyObject *result = NULL, *workers = NULL;
    View views[MAX_VIEWS];
    Py_buffer fb[MAX_VIEWS];
    const uint64_t *filt[MAX_VIEWS];
    int nloaded = 0, nfilt_loaded[MAX_VIEWS] = {0};
    /* per word: columns, media, alive bits, running AND, ends */
    Py_ssize_t *wcols = NULL, *wmi = NULL, *wstart = NULL;
    int64_t *wword = NULL;
    uint64_t *walive = NULL, *acc = NULL, *row = NULL;
    int32_t *ends = NULL, *credit = NULL;
    uint8_t *endorder = NULL;
    int32_t *nend = NULL;
    Py_ssize_t *slots = NULL;
    double *wts = NULL;
    void *scratch = NULL;

    if (nv > MAX_VIEWS) { PyErr_SetString(PyExc_ValueError, "too many views in the plan"); goto done; }
    if (PyList_GET_SIZE(weights) != nmedia) { PyErr_SetString(PyExc_ValueError, "weights and media differ in length"); goto done; }
    if (pm_fields) {  /* PrefixMatch's two slots set directly: no __init__ frame */
        result = ((PyTypeObject *)pm_cls)->tp_alloc((PyTypeObject *)pm_cls, 0);
        PyObject *pg = result ? PyLong_FromSsize_t(n) : NULL, *wd = pg ? PyDict_New() : NULL;
        PyObject *d0 = PyTuple_GET_ITEM(pm_fields, 0), *d1 = PyTuple_GET_ITEM(pm_fields, 1);
        if (!wd || Py_TYPE(d0)->tp_descr_set(d0, result, pg) < 0 || Py_TYPE(d1)->tp_descr_set(d1, result, wd) < 0) {
            Py_XDECREF(pg); Py_XDECREF(wd);
            goto fail;
        }
        Py_DECREF(pg); Py_DECREF(wd);
    } else {
        result = PyObject_CallFunction(pm_cls, "n", n);
    }
    if (!result) goto done;
    workers = PyObject_GetAttr(result, s_workers);
    if (!workers || !PyDict_Check(workers)) {
        if (workers) PyErr_SetString(PyExc_ValueError, "PrefixMatch.workers must be a dict");
        goto fail;
    }
    if (!n || !nv || !nw) goto done;
    Py_ssize_t nc = -1;
    for (Py_ssize_t i = 0; i < nv; i++) {
        PyObject *e = PyList_GET_ITEM(plan, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) { PyErr_SetString(PyExc_ValueError, "plan entries must be (view, filter)"); goto fail; }
        if (view_load(PyTuple_GET_ITEM(e, 0), &views[i], 0) < 0) goto fail;
        nloaded++;
        if (nc >= 0 && views[i].nc != nc) { PyErr_SetString(PyExc_ValueError, "views differ in mask columns"); goto fail; }
        nc = views[i].nc;
        PyObject *f = PyTuple_GET_ITEM(e, 1);
        filt[i] = NULL;
        if (f != Py_None) {
            if (get_buf(f, &fb[i], 8, "QL", 0, "filter") < 0) goto fail;
            nfilt_loaded[i] = 1;
            if (fb[i].len / 8 != nc) { PyErr_SetString(PyExc_ValueError, "filter length differs from the mask columns"); goto fail; }
            filt[i] = fb[i].buf;
        }
    }
    for (Py_ssize_t m = 0; m < nmedia; m++) {
        if (!PyFloat_CheckExact(PyList_GET_ITEM(weights, m))) {  /* the Python twin keeps int scores */
            Py_CLEAR(result);
            result = Py_NotImplemented;
            Py_INCREF(result);
            goto done;
        }
    }
    wts = PyMem_Malloc(sizeof(double) * (nmedia + 1));
    if (!wts) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t m = 0; m < nmedia; m++) {
        wts[m] = PyFloat_AsDouble(PyList_GET_ITEM(weights, m));
        if (wts[m] == -1.0 && PyErr_Occurred()) goto fail;
    }
    /* the layout, flattened */
    Py_ssize_t ncolsall = 0;
    /* one scratch block, 8-byte parts first: wstart, wword, walive, acc, row, slots, nend, ends, endorder
     * (only nend must start at zero; `ends` is written before it is read) */
    size_t n8 = (size_t)(nw + 1) + 3 * (size_t)nw + (size_t)nc + (size_t)nv * 2 * BLOCK;
    scratch = PyMem_Malloc(n8 * 8 + (size_t)nw * 4 + (size_t)nw * 64 * 4 + (size_t)nw * 64 + 8);
    if (!scratch) { PyErr_NoMemory(); goto fail; }
    wstart = (Py_ssize_t *)scratch;
    wword = (int64_t *)(wstart + nw + 1);
    walive = (uint64_t *)(wword + nw);
    acc = walive + nw;
    row = acc + nw;
    slots = (Py_ssize_t *)(row + nc);
    nend = (int32_t *)(slots + (size_t)nv * 2 * BLOCK);
    ends = nend + nw;
    endorder = (uint8_t *)(ends + (size_t)nw * 64);
    memset(nend, 0, (size_t)nw * sizeof(int32_t));
    for (Py_ssize_t w = 0; w < nw; w++) {
        PyObject *lay = PyList_GET_ITEM(layout, w);
        PyObject *cols = PyObject_GetAttr(lay, s_cols);
        if (!cols) goto fail;
        if (!PyList_Check(cols) || PyList_GET_SIZE(cols) < 1) { Py_DECREF(cols); PyErr_SetString(PyExc_ValueError, "WordLayout.cols must be a non-empty list"); goto fail; }
        ncolsall += PyList_GET_SIZE(cols);
        Py_DECREF(cols);
    }
    wcols = PyMem_Calloc(ncolsall + 1, sizeof(Py_ssize_t));
    wmi = PyMem_Calloc(ncolsall + 1, sizeof(Py_ssize_t));
    if (!wcols || !wmi) { PyErr_NoMemory(); goto fail; }
    Py_ssize_t at = 0;
    int anymulti = 0;
    for (Py_ssize_t w = 0; w < nw; w++) {
        PyObject *lay = PyList_GET_ITEM(layout, w);
        PyObject *cols = PyObject_GetAttr(lay, s_cols);
        PyObject *word = PyObject_GetAttr(lay, s_word);
        PyObject *alive = PyObject_GetAttr(lay, s_alive);
        int bad = !cols || !word || !alive;
        if (!bad) {
            if (as_i64(word, &wword[w], "WordLayout.word") < 0 || wword[w] < 0 || wword[w] > ((int64_t)1 << 40)) bad = 1;
            else {
                walive[w] = PyLong_AsUnsignedLongLong(alive);
                if (PyErr_Occurred()) { PyErr_Clear(); PyErr_SetString(PyExc_ValueError, "WordLayout.alive must be a 64-bit mask"); bad = 1; }
            }
        }
        wstart[w] = at;
        for (Py_ssize_t c = 0; !bad && c < PyList_GET_SIZE(cols); c++) {
            PyObject *pair = PyList_GET_ITEM(cols, c);
            int64_t col, mi;
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || as_i64(PyTuple_GET_ITEM(pair, 0), &col, "column") < 0 ||
                as_i64(PyTuple_GET_ITEM(pair, 1), &mi, "medium index") < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "WordLayout.cols entries must be (column, medium index)"); bad = 1; break; }
            if (col < 0 || col >= nc || mi < 0 || mi >= nmedia) { PyErr_SetString(PyExc_ValueError, "layout column or medium index out of range"); bad = 1; break; }
            wcols[at] = (Py_ssize_t)col; wmi[at] = (Py_ssize_t)mi; at++;
        }
        Py_XDECREF(cols); Py_XDECREF(word); Py_XDECREF(alive);
        if (bad) goto fail;
        if (at - wstart[w] > 1) anymulti = 1;
        acc[w] = walive[w];
    }
    wstart[nw] = at;
    if (anymulti) {
        credit = PyMem_Calloc((size_t)nw * nmedia * 64, sizeof(int32_t));
        if (!credit) { PyErr_NoMemory(); goto fail; }
    }
    /* walk, software-pipelined by blocks of BLOCK pages: the buckets of block j+2 are prefetched
     * and block j+1 is probed (its mask rows prefetched) before block j is walked */
#define PREFETCH_KEYS(lo)                                                                            \
    for (Py_ssize_t i = (lo); i < (lo) + BLOCK && i < n; i++)                                           \
        for (Py_ssize_t v = 0; v < nv; v++) PREFETCH(views[v].keys + home_of(&views[v], q[i]) * SLOTS);
#define PROBE_BLOCK(lo)                                                                              \
    for (Py_ssize_t i = (lo); i < (lo) + BLOCK && i < n; i++)                                           \
        for (Py_ssize_t v = 0; v < nv; v++) {                                                         \
            Py_ssize_t s = probe(&views[v], q[i], home_of(&views[v], q[i]));                          \
            if (s == -2) goto fail;                                                                   \
            slots[((((lo) / BLOCK) & 1) * nv + v) * BLOCK + (i - (lo))] = s;                          \
            if (s >= 0) PREFETCH(views[v].masks + s * nc);                                            \
        }
    PREFETCH_KEYS(0)
    PREFETCH_KEYS(BLOCK)
    PROBE_BLOCK(0)
    int going = 1;
    for (Py_ssize_t base = 0; base < n && going; base += BLOCK) {
        Py_ssize_t stop = base + BLOCK < n ? base + BLOCK : n;
        PREFETCH_KEYS(base + 2 * BLOCK)
        PROBE_BLOCK(base + BLOCK)
        const Py_ssize_t *bslots = slots + ((base / BLOCK) & 1) * nv * BLOCK;
        for (Py_ssize_t i = base; i < stop && going; i++) {
            const uint64_t *rowp = row;
            if (nv == 1 && !filt[0]) {  /* one unfiltered view: its row in place (absent: the zero row n) */
                Py_ssize_t s = bslots[i - base];
                rowp = views[0].masks + (s >= 0 ? s : views[0].n) * nc;
            } else {
                for (Py_ssize_t c = 0; c < nc; c++) row[c] = 0;  /* (no memset: its stores stall the loads) */
                for (Py_ssize_t v = 0; v < nv; v++) {
                    Py_ssize_t s = bslots[v * BLOCK + (i - base)];
                    if (s < 0) continue;
                    const uint64_t *r = views[v].masks + s * nc;
                    if (filt[v]) for (Py_ssize_t c = 0; c < nc; c++) row[c] |= r[c] & filt[v][c];
                    else for (Py_ssize_t c = 0; c < nc; c++) row[c] |= r[c];
                }
            }
            going = 0;
            for (Py_ssize_t w = 0; w < nw; w++) {
                uint64_t a = acc[w];
                if (!a) continue;
                uint64_t held = 0;
                for (Py_ssize_t c = wstart[w]; c < wstart[w + 1]; c++) held |= rowp[wcols[c]];
                uint64_t now = a & held;
                if (now != a) {
                    uint64_t ended = a & ~now;
                    if (i > 0)
                        while (ended) {
                            int b = CTZ64(ended);
                            ends[w * 64 + b] = (int32_t)i;
                            endorder[w * 64 + nend[w]++] = (uint8_t)b;
                            ended &= ended - 1;
                        }
                    acc[w] = a = now;
                }
                if (!a) continue;
                going = 1;
                if (wstart[w + 1] - wstart[w] > 1) {
                    uint64_t rest = a;
                    for (Py_ssize_t c = wstart[w]; c < wstart[w + 1] && rest; c++) {
                        uint64_t got = rowp[wcols[c]] & rest;
                        rest &= ~got;
                        int32_t *cr = credit + ((size_t)w * nmedia + wmi[c]) * 64;
                        while (got) { cr[CTZ64(got)]++; got &= got - 1; }
                    }
                }
            }
        }
    }
    for (Py_ssize_t w = 0; w < nw; w++) {  /* still matching at the last page */
        uint64_t a = acc[w];
        while (a) {
            int b = CTZ64(a);
            ends[w * 64 + b] = (int32_t)n;
            endorder[w * 64 + nend[w]++] = (uint8_t)b;
            a &= a - 1;
        }
    }
    /* results, word by word in layout order, workers in the order their prefixes ended */
    Py_ssize_t total = 0;
    for (Py_ssize_t w = 0; w < nw; w++) total += nend[w];
#if PY_VERSION_HEX < 0x030D0000
    if (pm_fields && total > 5 && PyDict_GET_SIZE(workers) == 0) {  /* sized once, not grown 8 -> 16 -> 32 -> 64 */
        PyObject *sized = _PyDict_NewPresized(total), *d1 = PyTuple_GET_ITEM(pm_fields, 1);
        if (!sized || Py_TYPE(d1)->tp_descr_set(d1, result, sized) < 0) { Py_XDECREF(sized); goto fail; }
        Py_SETREF(workers, sized);
    }
#endif
    for (Py_ssize_t w = 0; w < nw; w++) {
        int multi = wstart[w + 1] - wstart[w] > 1;
        for (int e = 0; e < nend[w]; e++) {
            int b = endorder[w * 64 + e];
            long long pages = ends[w * 64 + b];
            PyObject *bym = PyDict_New(), *score = NULL, *pg = NULL, *wm = NULL, *wi = NULL;
            if (!bym) goto fail;
            if (!multi) {
                Py_ssize_t mi = wmi[wstart[w]];
                if (!last_pg || pages != last_pages || mi != last_mi) {  /* ints and floats are immutable */
                    Py_CLEAR(last_pg);
                    Py_CLEAR(last_score);
                    last_pg = PyLong_FromLongLong(pages);
                    last_score = last_pg ? PyFloat_FromDouble((double)pages * wts[mi]) : NULL;
                    if (!last_score) { Py_DECREF(bym); goto fail; }
                    last_pages = pages;
                    last_mi = mi;
                }
                pg = last_pg; score = last_score;
                Py_INCREF(pg); Py_INCREF(score);
                if (PyDict_SetItem(bym, PyList_GET_ITEM(media, mi), pg) < 0) {
                    Py_DECREF(pg); Py_DECREF(score); Py_DECREF(bym);
                    goto fail;
                }
            } else {
                /* media in first-appearance order of the word's columns, as the Python twin's dict */
                PyObject *terms = PyList_New(0);
                if (!terms) { Py_DECREF(bym); goto fail; }
                int ok = 1;
                for (Py_ssize_t c = wstart[w]; c < wstart[w + 1] && ok; c++) {
                    int first = 1;
                    for (Py_ssize_t c2 = wstart[w]; c2 < c; c2++) if (wmi[c2] == wmi[c]) first = 0;
                    if (!first) continue;
                    int32_t k = credit[((size_t)w * nmedia + wmi[c]) * 64 + b];
                    if (!k) continue;
                    PyObject *kk = PyLong_FromLong(k);
                    PyObject *term = PyFloat_FromDouble(wts[wmi[c]] * (double)k);
                    if (!kk || !term || PyDict_SetItem(bym, PyList_GET_ITEM(media, wmi[c]), kk) < 0 || PyList_Append(terms, term) < 0) ok = 0;
                    Py_XDECREF(kk); Py_XDECREF(term);
                }
                if (ok) score = PyObject_CallOneArg(sum_fn, terms);
                Py_DECREF(terms);
                pg = score ? PyLong_FromLongLong(pages) : NULL;
                if (!pg) { Py_XDECREF(score); Py_DECREF(bym); goto fail; }
            }
            PyObject *argv[3] = {pg, score, bym};
            if (wm_fields) {  /* the dataclass's three slots filled in place: no __init__ frame */
                wm = ((PyTypeObject *)wm_cls)->tp_alloc((PyTypeObject *)wm_cls, 0);
                for (int f = 0; wm && f < 3; f++) {  /* fresh and zeroed: no old value to drop */
                    Py_INCREF(argv[f]);
                    *(PyObject **)((char *)wm + wm_off[f]) = argv[f];
                }
                /* it holds an int, a float and a dict of str -> int: it can be part of no cycle
                 * unless a caller reassigns a field, so the cyclic GC need not track it (a lookup
                 * then adds 2 tracked objects instead of ~20: fewer gen-0 collections inside
                 * lookups, which showed in the p99) */
                if (wm && PyObject_IS_GC(wm) && PyObject_GC_IsTracked(wm)) PyObject_GC_UnTrack(wm);
            } else {
                wm = PyObject_Vectorcall(wm_cls, argv, 3, NULL);
            }
            Py_DECREF(pg); Py_DECREF(score); Py_DECREF(bym);
            if (!wm) goto fail;
            wi = PyLong_FromLongLong(wword[w] * 64 + b);
            int rc = wi ? PyDict_SetItem(workers, wi, wm) : -1;
            Py_XDECREF(wi); Py_DECREF(wm);
            if (rc < 0) goto fail;
        }
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    Py_XDECREF(workers);
    Py_XDECREF(last_pg);
    Py_XDECREF(last_score);
    for (int i = 0; i < nloaded; i++) {
        view_release(&views[i]);
        if (nfilt_loaded[i]) PyBuffer_Release(&fb[i]);
    }
    PyBuffer_Release(&hb);
    PyMem_Free(wcols); PyMem_Free(wmi); PyMem_Free(scratch); PyMem_Free(credit); PyMem_Free(wts);
    return result;
}

/* walk_with((plan, layout, media, weights, PrefixMatch, WorkerMatch, sum, wm_fields, pm_fields), hashes):
 * walk with its other arguments bound once (kvevents.native.bind_walk) */
static PyObject *walk_with(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 9) {
        PyErr_SetString(PyExc_ValueError, "walk_with takes (the 9 bound walk arguments, hashes)");
        return NULL;
    }
    PyObject *full = PyTuple_New(10);
    if (!full) return NULL;
    Py_INCREF(args[1]);
    PyTuple_SET_ITEM(full, 0, args[1]);
    for (Py_ssize_t i = 0; i < 9; i++) {
        PyObject *a = PyTuple_GET_ITEM(args[0], i);
        Py_INCREF(a);
        PyTuple_SET_ITEM(full, i + 1, a);
    }
    PyObject *out = walk(self, full);
    Py_DECREF(full);
    return out;
}

/* ------------------------------------------------------------------ apply */

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
        if (as_i64(items[i], &out[i], what) < 0) { PyMem_Free(out); return NULL; }
    return out;
}

/* set_bits_each(cview, hashes, col, bit, prev) -> (duplicates, live added, used added), or None when a
 * hash equals the table's vacant key (the Python twin moves it). The twin of HashTable.set_bits_each;
 * room must be reserved first (a full table raises ValueError). */
static PyObject *set_bits_each(PyObject *self, PyObject *args) {
    PyObject *tv, *hashes, *bitobj, *prevobj;
    Py_ssize_t col;
    if (!PyArg_ParseTuple(args, "OOnOO", &tv, &hashes, &col, &bitobj, &prevobj)) return NULL;
    uint64_t bit = PyLong_Check(bitobj) ? PyLong_AsUnsignedLongLong(bitobj) : 0;
    if (PyErr_Occurred() || !bit) { PyErr_Clear(); PyErr_SetString(PyExc_ValueError, "bit must be a non-zero 64-bit mask"); return NULL; }
    int64_t prev = 0;
    int have_prev = prevobj != Py_None;
    if (have_prev && as_i64(prevobj, &prev, "prev") < 0) return NULL;
    Py_ssize_t n;
    int64_t *hs = ints_of(hashes, &n, "hashes");
    if (!hs) return NULL;
    View v;
    if (view_load(tv, &v, 1) < 0) { PyMem_Free(hs); return NULL; }
    PyObject *dups = NULL, *ret = NULL;
    if (col < 0 || col >= v.nc) { PyErr_SetString(PyExc_ValueError, "col out of range"); goto out; }
    for (Py_ssize_t i = 0; i < n; i++)
        if (hs[i] == v.vacant) { ret = Py_None; Py_INCREF(ret); goto out; }
    dups = PyList_New(0);
    if (!dups) goto out;
    PyObject **items = PySequence_Fast_ITEMS(hashes);
    Py_ssize_t live = 0, used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t h = hs[i];
        Py_ssize_t home = home_of(&v, h);
        Py_ssize_t s = probe(&v, h, home);
        if (s == -2) goto out;
        if (s < 0) {
            Py_ssize_t b = home, tries = 0;
            for (;; b = (b + 1) & (v.buckets - 1)) {
                if (tries++ >= v.buckets) { PyErr_SetString(PyExc_ValueError, "table full: reserve room first"); goto out; }
                uint64_t word;
                memcpy(&word, v.state + b * SLOTS, 8);
                uint64_t free = ~word & LIVE_BYTES;
                if (!free) continue;
                s = b * SLOTS + (CTZ64(free) >> 3);
                break;
            }
            if (!v.state[s]) used++;
            v.state[s] = ST_LIVE;
            v.keys[s] = h;
            live++;
            if (b != home) {
                v.over[home] = 1;
                PyObject *kk = PyLong_FromLongLong(h), *ss = PyLong_FromSsize_t(s);
                int rc = kk && ss ? PyDict_SetItem(v.spill, kk, ss) : -1;
                Py_XDECREF(kk); Py_XDECREF(ss);
                if (rc < 0) goto out;
            }
        }
        uint64_t *m = v.masks + s * v.nc + col;
        if (*m & bit) {
            if (PyList_Append(dups, items[i]) < 0) goto out;
        } else {
            *m |= bit;
        }
        if (have_prev) {
            v.parent[s] = prev;
            v.state[s] |= ST_HAS_PARENT;
        }
        prev = h;
        have_prev = 1;
    }
    ret = Py_BuildValue("(Onn)", dups, live, used);
out:
    Py_XDECREF(dups);
    view_release(&v);
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
        if (s / SLOTS != home_of(v, k)) {
            PyObject *kk = PyLong_FromLongLong(k);
            if (!kk || PyDict_DelItem(v->spill, kk) < 0) { Py_XDECREF(kk); return -1; }
            Py_DECREF(kk);
        }
    }
    v->keys[s] = v->vacant;
    v->state[s] = ST_TOMB;
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

/* remove_each(cviews, extra, mi, col, wi, hashes, prefer, exact) -> (unknown, ambiguous, removed,
 * [rows deleted per view]). The twin of consumers.copies.remove_each. */
static PyObject *remove_each(PyObject *self, PyObject *args) {
    PyObject *tvs, *extra, *mio, *wio, *hashes, *prefo;
    Py_ssize_t col;
    int exact;
    if (!PyArg_ParseTuple(args, "O!O!OnOOOp", &PyList_Type, &tvs, &PyDict_Type, &extra, &mio, &col, &wio, &hashes,
                          &prefo, &exact))
        return NULL;
    int64_t wi, prefer = -1;
    if (as_i64(wio, &wi, "wi") < 0 || wi < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "wi must be >= 0"); return NULL; }
    if (!PyLong_Check(mio)) { PyErr_SetString(PyExc_ValueError, "mi must be an int"); return NULL; }
    if (prefo != Py_None && as_i64(prefo, &prefer, "prefer") < 0) return NULL;
    uint64_t bit = (uint64_t)1 << (wi % 64);
    Py_ssize_t nv = PyList_GET_SIZE(tvs);
    if (nv > MAX_VIEWS || nv < 1) { PyErr_SetString(PyExc_ValueError, "1 to 64 views"); return NULL; }
    Py_ssize_t n;
    int64_t *hs = ints_of(hashes, &n, "hashes");
    if (!hs) return NULL;
    View views[MAX_VIEWS];
    Py_ssize_t deleted[MAX_VIEWS] = {0};
    int loaded = 0;
    PyObject *ret = NULL;
    for (; loaded < nv; loaded++) {
        if (view_load(PyList_GET_ITEM(tvs, loaded), &views[loaded], 1) < 0) goto out;
        if (col < 0 || col >= views[loaded].nc) { loaded++; PyErr_SetString(PyExc_ValueError, "col out of range"); goto out; }
    }
    PyObject **items = PySequence_Fast_ITEMS(hashes);
    Py_ssize_t unknown = 0, ambiguous = 0, removed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t h = hs[i];
        Py_ssize_t holder = -1, hs_slot = -1;
        int several = 0;
        for (Py_ssize_t vid = 0; vid < nv; vid++) {
            View *v = &views[vid];
            Py_ssize_t s = probe(v, h, home_of(v, h));
            if (s == -2) goto out;
            if (s >= 0 && (v->masks[s * v->nc + col] & bit)) {
                if (holder >= 0) {
                    several = 1;
                    if (holder == prefer) break;
                }
                if (holder < 0 || vid == prefer) { holder = vid; hs_slot = s; }
                if (several && prefo == Py_None) break;
            }
        }
        if (holder < 0) { unknown++; continue; }
        if (several && !(exact && holder == prefer)) ambiguous++;
        removed++;
        if (PyDict_GET_SIZE(extra)) {
            int t = take_extra(extra, holder, mio, wio, items[i]);
            if (t < 0) goto out;
            if (t) continue;
        }
        int d = clear_bit(&views[holder], hs_slot, col, bit);
        if (d < 0) goto out;
        deleted[holder] += d;
    }
    PyObject *dl = PyList_New(nv);
    if (!dl) goto out;
    for (Py_ssize_t v = 0; v < nv; v++) PyList_SET_ITEM(dl, v, PyLong_FromSsize_t(deleted[v]));
    ret = Py_BuildValue("(nnnN)", unknown, ambiguous, removed, dl);
out:
    for (int i = 0; i < loaded; i++) view_release(&views[i]);
    PyMem_Free(hs);
    return ret;
}

/* holds_bit(cviews, h, cols, bit) -> bool: does any view hold h with `bit` set in any of `cols`? */
static PyObject *holds_bit(PyObject *self, PyObject *args) {
    PyObject *tvs, *ho, *cols, *bito;
    if (!PyArg_ParseTuple(args, "O!OO!O", &PyList_Type, &tvs, &ho, &PyList_Type, &cols, &bito)) return NULL;
    int64_t h;
    if (as_i64(ho, &h, "hash") < 0) return NULL;
    uint64_t bit = PyLong_Check(bito) ? PyLong_AsUnsignedLongLong(bito) : 0;
    if (PyErr_Occurred()) { PyErr_Clear(); PyErr_SetString(PyExc_ValueError, "bit must be a 64-bit mask"); return NULL; }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tvs); i++) {
        View v;
        if (view_load(PyList_GET_ITEM(tvs, i), &v, 0) < 0) return NULL;
        Py_ssize_t s = probe(&v, h, home_of(&v, h));
        int found = 0;
        for (Py_ssize_t c = 0; s >= 0 && c < PyList_GET_SIZE(cols); c++) {
            int64_t col;
            if (as_i64(PyList_GET_ITEM(cols, c), &col, "column") < 0) { s = -2; break; }
            if (col < 0 || col >= v.nc) { PyErr_SetString(PyExc_ValueError, "column out of range"); s = -2; break; }
            if (v.masks[s * v.nc + col] & bit) { found = 1; break; }
        }
        view_release(&v);
        if (s == -2) return NULL;
        if (found) Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"chain_pages", chain_pages, METH_VARARGS, "chain_pages(pages, prior) -> list of 32-byte digests"},
    {"chain_packed", chain_packed, METH_VARARGS, "chain_packed(data, page_size, prior) -> concatenated digests"},
    {"digests_int64", digests_int64, METH_O, "digests_int64(digests) -> native int64 bytes (the published ints)"},
    {"pack_u32", pack_u32, METH_O, "pack_u32(list) -> little-endian uint32 bytes, or None (bad id)"},
    {"chain_list", chain_list, METH_VARARGS, "chain_list(tokens, page_size, prior, whole) -> digests, or None (bad id)"},
    {"pack_json_u32", pack_json_u32, METH_O, "pack_json_u32(text) -> uint32 bytes of a JSON id array, or None"},
    {"split_json_tokens", split_json_tokens, METH_O, "split_json_tokens(body) -> (start, stop, packed ids), or None"},
    {"all_int64", all_int64, METH_VARARGS, "all_int64(hashes, prev) -> every value an exact int in int64 range"},
    {"sha_impl", sha_impl, METH_NOARGS, "the SHA-256 compression in use: 'sha-ni' or 'portable'"},
    {"select_sha", select_sha, METH_O, "select_sha(allow_shani) -> the compression now in use"},
    {"walk", walk, METH_VARARGS, "the index walk over a plan of table views"},
    {"walk_with", (PyCFunction)(void (*)(void))walk_with, METH_FASTCALL, "walk with its other arguments bound"},
    {"set_bits_each", set_bits_each, METH_VARARGS, "the store loop of HashTable.set_bits_each"},
    {"remove_each", remove_each, METH_VARARGS, "the remove loop of consumers.copies.remove_each"},
    {"holds_bit", holds_bit, METH_VARARGS, "does any view hold a key with a bit in the columns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "kvevents.native._speedups",
                                    "Optional compiled fast path (see kvevents/native/__init__.py).", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    kv_sha256_select(1);
    if (!(s_cols = PyUnicode_InternFromString("cols")) || !(s_word = PyUnicode_InternFromString("word")) ||
        !(s_alive = PyUnicode_InternFromString("alive")) || !(s_workers = PyUnicode_InternFromString("workers")))
        return NULL;
    return PyModule_Create(&moddef);
}
