/* A request's page chain hashed as its consumer asks for pages (kv_feed_*, in _chain.c): the index walk
 * (BoundWalk.packed, _walk_bound.c) asks for each page's int64 just before it first reads it, so the
 * chain's SHA-256, which is latency-bound, and the walk's table reads, which are memory-bound, run side
 * by side in the CPU instead of one after the other. Packed ids only: a token list's own reads compete
 * with the table's for the same memory and the two together measured slower than apart. */
#ifndef KVEVENTS_FEED_H
#define KVEVENTS_FEED_H

#include "_native.h"

typedef struct KvFeed {
    Py_buffer pb;       /* packed little-endian uint32 ids */
    int pb_held;
    Py_ssize_t page_size, npages, done; /* whole pages; pages hashed so far */
    uint8_t prev[32];   /* the running digest */
    int have;           /* prev is set (a prior, or a page hashed) */
    PyObject *out;      /* bytes of npages native int64: the pages' published hashes */
} KvFeed;

/* Open a feed over packed ids cut into whole pages of page_size ids (a partial tail is never hashed),
 * after `prior` (a 32-byte digest or None): 0, or -1 with ValueError (kv_feed_close it either way). */
KV_HIDDEN int kv_feed_open(KvFeed *F, PyObject *packed, PyObject *page_size, PyObject *prior);
/* Hash the pages up to `upto` (capped at npages) not hashed yet. */
KV_HIDDEN void kv_feed_upto(KvFeed *F, Py_ssize_t upto);
KV_HIDDEN const int64_t *kv_feed_ints(const KvFeed *F);
KV_HIDDEN void kv_feed_close(KvFeed *F);

#endif
