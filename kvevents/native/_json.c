/* The POST /score body's token ids read straight into the packed uint32 form the page chain hashes
 * (kvevents/consumers/service/score_body.py decides when; the pure-Python twins are pack_json_ids_py
 * and split_json_tokens_py). A long body is read with the GIL let go (issue 28: the router's event
 * loop serves meanwhile). */
#include "_native.h"

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
PyObject *kv_pack_json_u32(PyObject *self, PyObject *arg) {
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
PyObject *kv_split_json_tokens(PyObject *self, PyObject *arg) {
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
