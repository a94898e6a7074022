/* A slot's holders as C reads and writes them: its rows word (0, an inline pair `col << 32 | bits`, or
 * ROW_REF | cls << 56 | offset of a pool record `shares << 40 | len << 8 | cls` + len pairs), the pool's blocks
 * and free lists. A record may be named by several slots with the same holders (consecutive pages of a
 * chain: a store names the previous page's record when its result would equal it); `shares` counts the
 * slots beyond the first, and a write to a shared record copies it first (copy on write), except
 * clear_worker's, which every sharer undergoes alike. The twin of kvevents/consumers/holders.py: the same
 * writes in the same order, so both leave identical arrays. Records are checked against the pool before
 * use (a bad one is a ValueError, never a stray read). Shared by _apply.c and _walk.c. */
#ifndef KVEVENTS_HOLDERS_H
#define KVEVENTS_HOLDERS_H

#include "_table.h"

#define KV_LOW 0xFFFFFFFFULL
#define KV_CLS 0xFFULL
#define KV_REC_LEN(h) (((h) >> 8) & KV_LOW)
#define KV_REC_SHARES(h) ((h) >> KV_REC_SHARES_SHIFT)
#define KV_ONE_SHARE (1ULL << KV_REC_SHARES_SHIFT)

/* The record of rows word r (r >= ROW_REF): its pairs, length and class; 0, or -1 with ValueError. */
static HOT_INLINE int rec_open(const View *v, uint64_t r, uint64_t **pairs, Py_ssize_t *len, int *cls) {
    uint64_t o = r & KV_ROW_OFFSET;
    if (UNLIKELY(o < 1 || o >= (uint64_t)v->npool)) return kv_bad_record();
    uint64_t h = v->pool[o];
    uint64_t c = h & KV_CLS, n = KV_REC_LEN(h);
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

/* One slot fewer names the record at o (opened): its shares down by one, or the block freed. */
static inline void rec_release(View *v, uint64_t o) {
    if (KV_REC_SHARES(v->pool[o])) v->pool[o] -= KV_ONE_SHARE;
    else pool_free(v, o);
}

/* Is pw (the previous page's rows word) a record, not shared to the limit, whose pairs are old[0..n) with
 * `pair` OR-ed into old[at] (at >= 0) or appended (at < 0)? Then a store can name it instead of writing. */
static HOT_INLINE int rec_is(const View *v, uint64_t pw, const uint64_t *old, Py_ssize_t n, Py_ssize_t at, uint64_t pair) {
    if (pw < KV_ROW_REF) return 0;
    uint64_t o = pw & KV_ROW_OFFSET, *q = NULL;
    Py_ssize_t nq = 0;
    int cls = 0;
    if (rec_open(v, pw, &q, &nq, &cls) < 0) { PyErr_Clear(); return 0; } /* a bad record: not shared */
    if (nq != n + (at < 0) || KV_REC_SHARES(v->pool[o]) >= KV_REC_SHARES_MAX) return 0;
    for (Py_ssize_t j = 0; j < n; j++)
        if (q[j] != (j == at ? old[j] | pair : old[j])) return 0;
    return at >= 0 || q[n] == pair;
}

/* Slot s names pw's record (one share more). */
static inline void rec_share(View *v, Py_ssize_t s, uint64_t pw) {
    v->pool[pw & KV_ROW_OFFSET] += KV_ONE_SHARE;
    v->rows[s] = pw;
}

/* Set `bit` of column col in slot s; pw is the rows word of the page before it in the chain (0: none),
 * whose record s names when the result would equal it. 0 set (*dup: it was set already), 1 the pool has
 * no room (nothing written; *need: the words it wants), -1 error. */
static HOT_INLINE int set_bit(View *v, Py_ssize_t s, uint64_t col, uint64_t bit, uint64_t pw, int *dup, int64_t *need) {
    uint64_t r = v->rows[s], pair = col << 32 | bit;
    *dup = 0;
    if (!r) { v->rows[s] = pair; return 0; }
    if (r < KV_ROW_REF) {
        if ((r >> 32) == col) {
            if (r & bit) *dup = 1;
            else v->rows[s] = r | bit;
            return 0;
        }
        if (rec_is(v, pw, &r, 1, -1, pair)) { rec_share(v, s, pw); return 0; }
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
    Py_ssize_t n = 0, at = -1;
    int cls = 0;
    if (rec_open(v, r, &p, &n, &cls) < 0) return -1;
    for (Py_ssize_t i = 0; i < n && at < 0; i++)
        if ((p[i] >> 32) == col) at = i;
    if (at >= 0 && (p[at] & bit)) { *dup = 1; return 0; }
    uint64_t o = r & KV_ROW_OFFSET;
    if (rec_is(v, pw, p, n, at, pair)) { rec_share(v, s, pw); rec_release(v, o); return 0; }
    int shared = KV_REC_SHARES(v->pool[o]) != 0;
    if (at >= 0 && !shared) { p[at] |= bit; return 0; }
    Py_ssize_t n2 = n + (at < 0);
    if (!shared && n2 < ((Py_ssize_t)KV_POOL_MIN_WORDS << cls)) {
        p[n] = pair;
        v->pool[o] = (uint64_t)n2 << 8 | (uint64_t)cls;
        return 0;
    }
    int cls2 = n2 < ((Py_ssize_t)KV_POOL_MIN_WORDS << cls) ? cls : cls + 1; /* shared: a copy; full: one class up */
    if (!pool_room(v, cls2)) {
        if (cls2 >= KV_POOL_CLASSES) { PyErr_SetString(PyExc_ValueError, "holders: a record past the largest pool class"); return -1; }
        *need = (int64_t)KV_POOL_MIN_WORDS << cls2;
        return 1;
    }
    uint64_t o2 = pool_alloc(v, cls2);
    if (!o2) return -1;
    uint64_t *q = v->pool + o2 + 1;
    memcpy(q, p, sizeof(uint64_t) * (size_t)n);
    if (at >= 0) q[at] |= bit;
    else q[n] = pair;
    v->pool[o2] = (uint64_t)n2 << 8 | (uint64_t)cls2;
    rec_release(v, o);
    v->rows[s] = KV_ROW_REF | (uint64_t)cls2 << KV_ROW_CLS_SHIFT | o2;
    return 0;
}

/* The pool words clear_bit(v, s, col, bit, 0) must allocate and finds no room for (0: none): a copy of a
 * shared record that keeps two pairs or more. -1 on a bad record. */
static HOT_INLINE int64_t clear_need(const View *v, Py_ssize_t s, uint64_t col, uint64_t bit) {
    uint64_t r = v->rows[s];
    if (r < KV_ROW_REF) return 0;
    uint64_t *p = NULL;
    Py_ssize_t n = 0;
    int cls = 0;
    if (rec_open(v, r, &p, &n, &cls) < 0) return -1;
    if (!KV_REC_SHARES(v->pool[r & KV_ROW_OFFSET])) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((p[i] >> 32) != col) continue;
        if (!(p[i] & bit) || ((p[i] & ~bit & KV_LOW) == 0 && n == 2) || pool_room(v, cls)) return 0;
        return (int64_t)KV_POOL_MIN_WORDS << cls;
    }
    return 0;
}

/* Clear `bit` of column col in slot s: 0 it was not set, 1 cleared, 2 cleared and the slot has no holder
 * left (its rows word is 0: the caller deletes it), -1 error. *k: the slots cleared. A shared record is
 * copied first (room checked by clear_need), unless `all` (clear_worker: every slot naming it is cleared
 * alike, so the record changes in place for all, *k = all of them; a sharer left with one pair goes
 * inline, the others when clear_worker reaches them). */
static HOT_INLINE int clear_bit(View *v, Py_ssize_t s, uint64_t col, uint64_t bit, int all, Py_ssize_t *k) {
    uint64_t r = v->rows[s];
    *k = 0;
    if (r < KV_ROW_REF) {
        if (!r || (r >> 32) != col || !(r & bit)) return 0;
        *k = 1;
        r &= ~bit;
        if (r & KV_LOW) { v->rows[s] = r; return 1; }
        v->rows[s] = 0;
        return 2;
    }
    uint64_t *p = NULL;
    Py_ssize_t n = 0;
    int cls = 0;
    if (rec_open(v, r, &p, &n, &cls) < 0) return -1;
    uint64_t o = r & KV_ROW_OFFSET, shares = KV_REC_SHARES(v->pool[o]);
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((p[i] >> 32) != col) continue;
        if (!(p[i] & bit)) return 0;
        uint64_t left = p[i] & ~bit;
        if (shares && !all) { /* copy on write */
            if (!(left & KV_LOW) && n == 2) { v->rows[s] = p[1 - i]; rec_release(v, o); *k = 1; return 1; }
            if (!pool_room(v, cls)) { PyErr_SetString(PyExc_ValueError, "holders: no pool room for a copy"); return -1; }
            uint64_t o2 = pool_alloc(v, cls);
            if (!o2) return -1;
            uint64_t *q = v->pool + o2 + 1;
            memcpy(q, p, sizeof(uint64_t) * (size_t)n);
            Py_ssize_t n2 = n;
            if (left & KV_LOW) q[i] = left;
            else q[i] = q[--n2];
            v->pool[o2] = (uint64_t)n2 << 8 | (uint64_t)cls;
            rec_release(v, o);
            v->rows[s] = KV_ROW_REF | (uint64_t)cls << KV_ROW_CLS_SHIFT | o2;
            *k = 1;
            return 1;
        }
        *k = (Py_ssize_t)shares + 1;
        if (left & KV_LOW) { p[i] = left; return 1; }
        p[i] = p[n - 1]; /* the last pair takes its place */
        n--;
        v->pool[o] = shares << KV_REC_SHARES_SHIFT | (uint64_t)n << 8 | (uint64_t)cls;
        if (n == 1) {
            v->rows[s] = p[0];
            rec_release(v, o);
        }
        return 1;
    }
    return 0;
}

/* clear_worker's first step at a slot: a record left with one pair (by a sharer's clear) goes inline here
 * too. 0, or -1 on a bad record. */
static inline int settle_inline(View *v, Py_ssize_t s) {
    uint64_t r = v->rows[s], *p = NULL;
    Py_ssize_t n = 0;
    int cls = 0;
    if (r < KV_ROW_REF) return 0;
    if (rec_open(v, r, &p, &n, &cls) < 0) return -1;
    if (n == 1) {
        v->rows[s] = p[0];
        rec_release(v, r & KV_ROW_OFFSET);
    }
    return 0;
}

#endif
