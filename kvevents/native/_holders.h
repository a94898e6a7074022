/* A slot's holders as C reads and writes them: its rows word (0, an inline pair `col << 32 | bits`, or
 * ROW_REF | cls << 56 | offset of a pool record `len << 8 | cls` + len pairs), the pool's blocks and free lists. The
 * twin of kvevents/consumers/holders.py: the same writes in the same order, so both leave identical
 * arrays. Records are checked against the pool before use (a bad one is a ValueError, never a stray read).
 * Shared by _apply.c and _walk.c. */
#ifndef KVEVENTS_HOLDERS_H
#define KVEVENTS_HOLDERS_H

#include "_table.h"

#define KV_LOW 0xFFFFFFFFULL
#define KV_CLS 0xFFULL

/* The record of rows word r (r >= ROW_REF): its pairs, length and class; 0, or -1 with ValueError. */
static HOT_INLINE int rec_open(const View *v, uint64_t r, uint64_t **pairs, Py_ssize_t *len, int *cls) {
    uint64_t o = r & KV_ROW_OFFSET;
    if (UNLIKELY(o < 1 || o >= (uint64_t)v->npool)) return kv_bad_record();
    uint64_t h = v->pool[o];
    uint64_t c = h & KV_CLS, n = h >> 8;
    if (UNLIKELY(c >= KV_POOL_CLASSES || (int)c != KV_ROW_CLS(r))) return kv_bad_record();
    uint64_t size = (uint64_t)KV_POOL_MIN_WORDS << c;
    if (UNLIKELY(n + 1 > size || o + size > (uint64_t)v->npool)) return kv_bad_record();
    *pairs = v->pool + o + 1;
    *len = (Py_ssize_t)n;
    *cls = (int)c;
    return 0;
}

/* The bits of column col in rows word r (*bits); 0, or -1 with ValueError. */
static HOT_INLINE int row_bits(const View *v, uint64_t r, uint64_t col, uint64_t *bits) {
    *bits = 0;
    if (r < KV_ROW_REF) {
        if (r && (r >> 32) == col) *bits = r & KV_LOW;
        return 0;
    }
    uint64_t *p = NULL;
    Py_ssize_t n = 0;
    int cls = 0;
    if (rec_open(v, r, &p, &n, &cls) < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((p[i] >> 32) == col) { *bits = p[i] & KV_LOW; break; }
    return 0;
}

/* Is there room for a block of class cls (a freed one, or past the bump pointer)? */
static inline int pool_room(const View *v, int cls) {
    if (cls >= KV_POOL_CLASSES) return 0;
    return v->pmeta[PM_FREE + cls] != 0 || v->pmeta[PM_TOP] + ((int64_t)KV_POOL_MIN_WORDS << cls) <= v->npool;
}

/* A block of class cls (room checked by pool_room); its offset, or 0 with ValueError (a bad free list). */
static inline uint64_t pool_alloc(View *v, int cls) {
    int64_t size = (int64_t)KV_POOL_MIN_WORDS << cls, o = v->pmeta[PM_FREE + cls];
    if (o) {
        if (o < 1 || o + size > v->npool) { kv_bad_record(); return 0; }
        v->pmeta[PM_FREE + cls] = (int64_t)v->pool[o + 1];
    } else {
        o = v->pmeta[PM_TOP];
        v->pmeta[PM_TOP] = o + size;
    }
    v->pmeta[PM_IN_USE] += size;
    v->pool[o] = (uint64_t)cls;
    return (uint64_t)o;
}

/* Give block o (opened: in range) back to its class's free list. */
static inline void pool_free(View *v, uint64_t o) {
    uint64_t cls = v->pool[o] & KV_CLS;
    v->pool[o] = cls;
    v->pool[o + 1] = (uint64_t)v->pmeta[PM_FREE + cls];
    v->pmeta[PM_FREE + cls] = (int64_t)o;
    v->pmeta[PM_IN_USE] -= (int64_t)KV_POOL_MIN_WORDS << cls;
}

/* Set `bit` of column col in slot s: 0 set (*dup: it was set already), 1 the pool has no room (nothing
 * written; *need: the words it wants), -1 error. */
static HOT_INLINE int set_bit(View *v, Py_ssize_t s, uint64_t col, uint64_t bit, int *dup, int64_t *need) {
    uint64_t r = v->rows[s], pair = col << 32 | bit;
    *dup = 0;
    if (!r) { v->rows[s] = pair; return 0; }
    if (r < KV_ROW_REF) {
        if ((r >> 32) == col) {
            if (r & bit) *dup = 1;
            else v->rows[s] = r | bit;
            return 0;
        }
        if (!pool_room(v, 0)) { *need = KV_POOL_MIN_WORDS; return 1; }
        uint64_t o = pool_alloc(v, 0); /* a second column: the row moves to a record */
        if (!o) return -1;
        v->pool[o] = 2 << 8;
        v->pool[o + 1] = r;
        v->pool[o + 2] = pair;
        v->rows[s] = KV_ROW_REF | o; /* class 0 */
        return 0;
    }
    uint64_t *p = NULL;
    Py_ssize_t n = 0;
    int cls = 0;
    if (rec_open(v, r, &p, &n, &cls) < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((p[i] >> 32) == col) {
            if (p[i] & bit) *dup = 1;
            else p[i] |= bit;
            return 0;
        }
    uint64_t o = r & KV_ROW_OFFSET;
    if ((uint64_t)n + 1 < ((uint64_t)KV_POOL_MIN_WORDS << cls)) {
        p[n] = pair;
        v->pool[o] = (uint64_t)(n + 1) << 8 | (uint64_t)cls;
        return 0;
    }
    if (!pool_room(v, cls + 1)) {
        if (cls + 1 >= KV_POOL_CLASSES) { PyErr_SetString(PyExc_ValueError, "holders: a record past the largest pool class"); return -1; }
        *need = (int64_t)KV_POOL_MIN_WORDS << (cls + 1);
        return 1;
    }
    uint64_t o2 = pool_alloc(v, cls + 1); /* full: one class up */
    if (!o2) return -1;
    memcpy(v->pool + o2 + 1, v->pool + o + 1, sizeof(uint64_t) * (size_t)n);
    v->pool[o2 + 1 + n] = pair;
    v->pool[o2] = (uint64_t)(n + 1) << 8 | (uint64_t)(cls + 1);
    pool_free(v, o);
    v->rows[s] = KV_ROW_REF | (uint64_t)(cls + 1) << KV_ROW_CLS_SHIFT | o2;
    return 0;
}

/* Clear `bit` of column col in slot s: 0 it was not set, 1 cleared, 2 cleared and the slot has no holder
 * left (its rows word is 0: the caller deletes it), -1 error. */
static HOT_INLINE int clear_bit(View *v, Py_ssize_t s, uint64_t col, uint64_t bit) {
    uint64_t r = v->rows[s];
    if (r < KV_ROW_REF) {
        if (!r || (r >> 32) != col || !(r & bit)) return 0;
        r &= ~bit;
        if (r & KV_LOW) { v->rows[s] = r; return 1; }
        v->rows[s] = 0;
        return 2;
    }
    uint64_t *p = NULL;
    Py_ssize_t n = 0;
    int cls = 0;
    if (rec_open(v, r, &p, &n, &cls) < 0) return -1;
    uint64_t o = r & KV_ROW_OFFSET;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((p[i] >> 32) != col) continue;
        if (!(p[i] & bit)) return 0;
        uint64_t left = p[i] & ~bit;
        if (left & KV_LOW) { p[i] = left; return 1; }
        p[i] = p[n - 1]; /* the last pair takes its place */
        n--;
        if (n == 1) {
            v->rows[s] = p[0];
            pool_free(v, o);
        } else {
            v->pool[o] = (uint64_t)n << 8 | (uint64_t)cls;
        }
        return 1;
    }
    return 0;
}

#endif
