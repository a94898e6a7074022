/* The POST /score body's token ids read straight into the packed uint32 form the page chain hashes
 * (kvevents/consumers/service/score_body.py decides when; its pure-Python twin is pack_json_ids_py). */
#include "_native.h"

/* pack_json_u32(text) -> little-endian uint32 bytes of a JSON array of token ids, or None unless the
 * text is exactly that: '[' ids ']' with JSON whitespace, each id plain digits (no sign, fraction,
 * exponent or leading zero) in 0..2**32-1. The /score body's tokens, read without an int object per
 * id; anything else (None) is decoded the usual way, which accepts or names it. The twin of
 * consumers.score_body.pack_json_ids_py. */
#define JSON_WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')
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
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    Py_ssize_t n = 0;
    while (p < end && JSON_WS(*p)) p++;
    if (p == end || *p++ != '[') goto bad;
    while (p < end && JSON_WS(*p)) p++;
    if (p < end && *p == ']') { p++; goto tail; }
    for (;;) {
        if (p == end || *p < '0' || *p > '9') goto bad;
        uint64_t v = (uint64_t)(*p++ - '0');
        if (v == 0 && p < end && *p >= '0' && *p <= '9') goto bad; /* a leading zero */
        int digits = 1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (++digits > 10) goto bad;
            v = v * 10 + (uint64_t)(*p++ - '0');
        }
        if (v > 0xFFFFFFFFULL) goto bad;
        o[0] = (uint8_t)v; o[1] = (uint8_t)(v >> 8); o[2] = (uint8_t)(v >> 16); o[3] = (uint8_t)(v >> 24);
        o += 4;
        n++;
        while (p < end && JSON_WS(*p)) p++;
        if (p == end) goto bad;
        if (*p == ']') { p++; break; }
        if (*p++ != ',') goto bad;
        while (p < end && JSON_WS(*p)) p++;
    }
tail:
    while (p < end && JSON_WS(*p)) p++;
    if (p != end) goto bad;
    PyBuffer_Release(&b);
    if (_PyBytes_Resize(&out, n * 4) < 0) return NULL;
    return out;
bad:
    PyBuffer_Release(&b);
    Py_DECREF(out);
    Py_RETURN_NONE;
}
#undef JSON_WS
