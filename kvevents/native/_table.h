/* A consumers/table.py HashTable as the C reads it: the layout constants both sides assume (their Python
 * side is kvevents/native/layout.py; kv_layout exports these and the switch compares them at import),
 * the view of a table's arrays, and the probe of one key. Shared by _table.c, _walk.c and _apply.c. */
#ifndef KVEVENTS_TABLE_H
#define KVEVENTS_TABLE_H

#include "_native.h"

/* the layout (kvevents/native/layout.py) */
#define KV_SLOTS 8                                /* slots per bucket: 8 int64 keys, one 64-byte line */
#define KV_EMPTY 0                                /* slot state: never used */
#define KV_LIVE 1                                 /* slot state bit: holds a key */
#define KV_TOMB 2                                 /* slot state: a deleted key (reusable) */
#define KV_HAS_PARENT 4                           /* slot state bit: the parent column is set */
#define KV_MIX 0x9E3779B97F4A7C15ULL              /* home bucket = (key * MIX) >> nshift */
#define KV_LIVE_BYTES 0x0101010101010101ULL       /* the LIVE bit of each of a bucket's 8 state bytes */
#define KV_WORD 32                                /* workers per column (a pair's low 32 bits) */
#define KV_EXTRA_ROWS 1                           /* rows has one zero word past the last slot */
#define KV_ROW_REF 0x8000000000000000ULL          /* a rows word naming a pool record */
#define KV_ROW_CLS_SHIFT 56                       /* its class at bits 56..62, its offset below */
#define KV_ROW_OFFSET ((1ULL << KV_ROW_CLS_SHIFT) - 1)
#define KV_ROW_CLS(r) ((int)(((r) >> KV_ROW_CLS_SHIFT) & 0x7F))
#define KV_POOL_CLASSES 26                        /* record sizes POOL_MIN_WORDS << 0..25 words */
#define KV_POOL_MIN_WORDS 4                       /* the smallest record: a header and 3 pairs */
#define KV_REC_SHARES_SHIFT 40                    /* a record header: shares << 40 | len << 8 | cls */
#define KV_REC_SHARES_MAX ((1ULL << 24) - 1)      /* slots beyond the first that may name one record */
enum { PM_TOP, PM_IN_USE, PM_FREE, PM_LEN = PM_FREE + KV_POOL_CLASSES }; /* pmeta's fields */
/* HashTable.cview(): the 10-tuple's fields, in order */
enum { CV_KEYS, CV_STATE, CV_PARENT, CV_ROWS, CV_OVERFLOW, CV_NSHIFT, CV_VACANT, CV_SPILL, CV_POOL, CV_PMETA, CV_LEN };

#define MAX_VIEWS 4096            /* table views one call may take */
#define MAX_COLUMN 0x7FFFFFFFLL   /* the largest column number a pair can carry */

/* A HashTable's arrays: (keys int64[n], state uint8[n], parent int64[n], rows uint64[n+1], overflow
 * uint8[n/8], nshift, vacant, spill dict, pool uint64[npool], pmeta int64[PM_LEN]). */
typedef struct {
    Py_buffer kb, sb, pb, rb, ob, plb, pmb;
    int64_t *keys;
    uint8_t *state;
    int64_t *parent;
    uint64_t *rows;
    uint8_t *over;
    uint64_t *pool;
    int64_t *pmeta;
    Py_ssize_t n, buckets, npool;
    int nshift;
    int64_t vacant;
    PyObject *spill;
    int held;
} View;

/* Open the view tuple `t` into v (writable: for the apply loops); 0, or -1 with ValueError. */
KV_HIDDEN int kv_view_load(PyObject *t, View *v, int writable);
KV_HIDDEN void kv_view_release(View *v);
/* The slot of a key off its home bucket, from the spill dict; -1 absent, -2 error. */
KV_HIDDEN COLD Py_ssize_t kv_probe_spill(const View *v, int64_t k);
/* Set ValueError for a rows word that names no valid record; returns -1. */
KV_HIDDEN COLD int kv_bad_record(void);

static inline Py_ssize_t home_of(const View *v, int64_t k) {
    return (Py_ssize_t)(((uint64_t)k * KV_MIX) >> v->nshift);
}

/* The slot of key k in its home bucket (b), else via the spill dict, else -1 (-2 on error). */
static HOT_INLINE Py_ssize_t probe(const View *v, int64_t k, Py_ssize_t b) {
    const int64_t *row = v->keys + b * KV_SLOTS;
    unsigned hit = 0;
    for (int j = 0; j < KV_SLOTS; j++) hit |= (unsigned)(row[j] == k) << j;  /* branch-free compare */
    if (hit && k != v->vacant) return b * KV_SLOTS + CTZ64(hit);
    if (k == v->vacant || !v->over[b] || !PyDict_GET_SIZE(v->spill)) return -1;
    return kv_probe_spill(v, k);
}

#endif
