/* The index walk (the twin of consumers/lookup.py's walk_plan): probe a request's pages in the plan's
 * table views, spread each page's holder pairs (each AND its view's filter) into a row of columns, AND
 * down the pages per word of 32 workers, credit each worker's pages to media, and hand the ends to
 * _walk_emit.c. A page costs its pairs plus the words still matching, not the fleet's width; a
 * page held by the page before's holders costs a compare, and one whose record differs from the page
 * before's in a few places costs those places (step_diff). Software-pipelined by blocks of BLOCK
 * pages; stops at the first page no worker holds. Its arguments: _walk_args.c. */
#include "_walk.h"

/* ------------------------------------------------------------------ the pages */

/* Prefetch the home buckets of pages [from, to) in every view, keys and rows words at once: a bucket's
 * 8 rows words are one line in a big table (its arrays start on huge pages, paged.py), so the rows line
 * need not wait for the probe (in a small table they may span two: the probe's prefetch takes the rest). */
static HOT_INLINE void prefetch_keys(const Walk *W, Py_ssize_t from, Py_ssize_t to) {
    const Py_ssize_t n = W->n, nv = W->nv;
    const int64_t *q = W->q;
    for (Py_ssize_t i = from; i < to && i < n; i++)
        for (Py_ssize_t v = 0; v < nv; v++) {
            const Py_ssize_t at = home_of(&W->views[v], q[i]) * KV_SLOTS;
            PREFETCH(W->views[v].keys + at);
            PREFETCH(W->views[v].rows + at);
        }
}

/* Where page i's probed slots and rows words live: its block's part of the ring (then v * BLOCK + i % BLOCK). */
static HOT_INLINE size_t ring_at(const Walk *W, Py_ssize_t i) { return (size_t)((i / BLOCK) % RING) * W->nv * BLOCK; }

/* Probe pages [from, to) in every view into the ring's `slots`, prefetching their rows words. */
static HOT_INLINE int probe_pages(Walk *W, Py_ssize_t from, Py_ssize_t to) {
    const Py_ssize_t n = W->n, nv = W->nv;
    const int64_t *q = W->q;
    for (Py_ssize_t i = from; i < to && i < n; i++) {
        Py_ssize_t *part = W->slots + ring_at(W, i), k = i % BLOCK;
        for (Py_ssize_t v = 0; v < nv; v++) {
            const View *view = &W->views[v];
            Py_ssize_t s = probe(view, q[i], home_of(view, q[i]));
            if (s == -2) return -1;
            part[v * BLOCK + k] = s;
            if (s >= 0) PREFETCH(view->rows + s);
        }
    }
    return 0;
}

/* Read the rows words of pages [from, to) (probed a block ago), prefetching their records whole (up to 4
 * lines: the class in the rows word gives the size before the header arrives), each once: pages of a
 * chain with the same holders name one record, and the walk skips a page whose rows words are the page
 * before's without reading it. */
static HOT_INLINE void load_pages(Walk *W, Py_ssize_t from, Py_ssize_t to) {
    const Py_ssize_t n = W->n, nv = W->nv;
    for (Py_ssize_t i = from; i < to && i < n; i++) {
        size_t at = ring_at(W, i);
        const Py_ssize_t *part = W->slots + at, k = i % BLOCK;
        uint64_t *rw = W->rw + at;
        for (Py_ssize_t v = 0; v < nv; v++) {
            Py_ssize_t s = part[v * BLOCK + k];
            uint64_t r = s >= 0 ? W->views[v].rows[s] : 0;
            rw[v * BLOCK + k] = r;
            uint64_t o = r & KV_ROW_OFFSET;
            if (k > 0 && r == rw[v * BLOCK + k - 1]) continue; /* the page before's (shared) record */
            if (r >= KV_ROW_REF && o < (uint64_t)W->views[v].npool) {
                const uint64_t *rec = W->views[v].pool + o;
                Py_ssize_t words = (Py_ssize_t)KV_POOL_MIN_WORDS << KV_ROW_CLS(r), most = W->views[v].npool - (Py_ssize_t)o;
                if (words > 32) words = 32;
                if (words > most) words = most;
                for (Py_ssize_t w = 0; w < words; w += 8) PREFETCH(rec + w);
                if (words > 1) PREFETCH(rec + words - 1);
            }
        }
    }
}

/* One pair of a page: its bits (AND the view's filter) into the row, if its column's word still matches. */
static HOT_INLINE void spread_pair(Walk *W, uint64_t p, const uint64_t *f) {
    uint64_t col = p >> 32;
    if (col >= (uint64_t)W->nc) return;
    int32_t w = W->colword[col];
    if (w < 0 || !W->acc[w]) return;
    W->row[col] |= f ? (p & KV_LOW & f[col]) : (p & KV_LOW);
}

/* Page k of a block: every view's pairs spread into the row. 0, or -1 on a bad record. */
static HOT_INLINE int spread_page(Walk *W, const uint64_t *rw, Py_ssize_t k) {
    for (Py_ssize_t v = 0; v < W->nv; v++) {
        uint64_t r = rw[v * BLOCK + k];
        if (!r) continue;
        const uint64_t *f = W->filt[v];
        if (r < KV_ROW_REF) { spread_pair(W, r, f); continue; }
        uint64_t *p = NULL;
        Py_ssize_t len = 0;
        int cls = 0;
        if (rec_open(&W->views[v], r, &p, &len, &cls) < 0) return -1;
        for (Py_ssize_t j = 0; j < len; j++) spread_pair(W, p[j], f);
    }
    return 0;
}

/* 1 when page k's holders are the previous page's in every view (the same rows word, or records with the
 * same pairs in the same order): its step could change nothing, so it is skipped. Only for layouts
 * without a word of several columns (whose pages are credited per medium one by one). */
static HOT_INLINE int same_as_before(Walk *W, const uint64_t *rw, Py_ssize_t k) {
    for (Py_ssize_t v = 0; v < W->nv; v++) {
        uint64_t r = rw[v * BLOCK + k], p = W->prev[v];
        if (r == p) continue;
        if (r < KV_ROW_REF || p < KV_ROW_REF) return 0;
        uint64_t *a = NULL, *b = NULL;
        Py_ssize_t na = 0, nb = 0;
        int cls;
        if (rec_open(&W->views[v], r, &a, &na, &cls) < 0 || rec_open(&W->views[v], p, &b, &nb, &cls) < 0) {
            PyErr_Clear(); /* a bad record: not the same; the spread says why */
            return 0;
        }
        if (na != nb || memcmp(a, b, sizeof(uint64_t) * (size_t)na)) return 0;
    }
    return 1;
}

/* Word w's bits in `ended` end their prefixes at page `at`, in this order. */
static HOT_INLINE void record_ends(Walk *W, Py_ssize_t w, uint64_t ended, Py_ssize_t at) {
    int32_t *ends = W->ends + w * KV_WORD, *nend = W->nend + w;
    uint8_t *order = W->endorder + w * KV_WORD;
    while (ended) {
        int b = CTZ64(ended);
        ends[b] = (int32_t)at;
        order[(*nend)++] = (uint8_t)b;
        ended &= ended - 1;
    }
}

/* One page for the words still matching: AND its held bits into the running prefix, note the prefixes
 * that end, credit a word of several columns per medium (first column holding it wins), zero the row's
 * columns read; words that stop matching leave the active list. 1 while any matches. */
static HOT_INLINE int step_words(Walk *W, Py_ssize_t i) {
    const Py_ssize_t nmedia = W->nmedia;
    const Py_ssize_t *wstart = W->wstart, *wcols = W->wcols, *wmi = W->wmi;
    uint64_t *acc = W->acc, *row = W->row;
    Py_ssize_t *act = W->act;
    int32_t *credit = W->credit;
    Py_ssize_t kept = 0;
    for (Py_ssize_t k = 0, nact = W->nact; k < nact; k++) {
        Py_ssize_t w = act[k];
        uint64_t a = acc[w], now;
        const Py_ssize_t lo = wstart[w], hi = wstart[w + 1];
        if (hi - lo == 1) { /* one medium: the common case */
            uint64_t *cell = row + wcols[lo];
            now = a & *cell;
            *cell = 0;
        } else {
            uint64_t held = 0;
            for (Py_ssize_t c = lo; c < hi; c++) held |= row[wcols[c]];
            now = a & held;
            uint64_t rest = now;
            for (Py_ssize_t c = lo; c < hi; c++) {
                uint64_t got = row[wcols[c]] & rest;
                row[wcols[c]] = 0;
                rest &= ~got;
                int32_t *cr = credit + ((size_t)w * nmedia + wmi[c]) * KV_WORD;
                while (got) { cr[CTZ64(got)]++; got &= got - 1; }
            }
        }
        if (now != a) {
            if (i > 0) record_ends(W, w, a & ~now, i);
            acc[w] = now;
        }
        if (now) act[kept++] = w;
    }
    W->nact = kept;
    return kept > 0;
}

/* One page for layouts of one column per word (no per-medium credit): one pass over the page's pairs
 * instead of spreading them into the row and stepping every word still matching. A word's bits are
 * OR-ed over its pairs (several views), AND-ed into its prefix; words the page names no pair of end
 * here. Same results as spread_page + step_words. 1 while any word matches, -1 on a bad record. */
static HOT_INLINE int step_pairs(Walk *W, const uint64_t *rw, Py_ssize_t k, Py_ssize_t i) {
    const uint32_t now_tick = ++W->tick;
    uint64_t *acc = W->acc, *held = W->held;
    uint32_t *stamp = W->stampw;
    Py_ssize_t ntouch = 0;
    for (Py_ssize_t v = 0; v < W->nv; v++) {
        uint64_t r = rw[v * BLOCK + k], *p = &r;
        if (!r) continue;
        const uint64_t *f = W->filt[v];
        Py_ssize_t len = 1;
        int cls = 0;
        if (r >= KV_ROW_REF && rec_open(&W->views[v], r, &p, &len, &cls) < 0) return -1;
        for (Py_ssize_t j = 0; j < len; j++) {
            uint64_t col = p[j] >> 32;
            if (col >= (uint64_t)W->nc) continue;
            int32_t w = W->colword[col];
            if (w < 0 || !acc[w]) continue;
            uint64_t bits = f ? (p[j] & KV_LOW & f[col]) : (p[j] & KV_LOW);
            if (stamp[w] != now_tick) {
                stamp[w] = now_tick;
                held[w] = bits;
                W->touch[ntouch++] = w;
            } else {
                held[w] |= bits;
            }
        }
    }
    int dropped = 0;
    for (Py_ssize_t t = 0; t < ntouch; t++) {
        Py_ssize_t w = W->touch[t];
        uint64_t a = acc[w], now = a & held[w];
        if (now == a) continue;
        if (i > 0) record_ends(W, w, a & ~now, i);
        acc[w] = now;
        dropped |= !now;
    }
    if (ntouch < W->nact) { /* words the page does not name: every prefix in them ends here */
        for (Py_ssize_t t = 0; t < W->nact; t++) {
            Py_ssize_t w = W->act[t];
            if (stamp[w] == now_tick) continue;
            if (i > 0) record_ends(W, w, acc[w], i);
            acc[w] = 0;
        }
        dropped = 1;
    }
    if (dropped) {
        Py_ssize_t kept = 0;
        for (Py_ssize_t t = 0; t < W->nact; t++)
            if (acc[W->act[t]]) W->act[kept++] = W->act[t];
        W->nact = kept;
    }
    return W->nact > 0;
}

/* ------------------------------------------------------------------ a page against the page before */

#define DIFF_MAX 8     /* positions two records may differ in for step_diff; past it, step_pairs */
#define STEP_SAME 2    /* the page's holders are the page before's: nothing to step */
#define DIFF_FALLBACK 3

/* A pair of page i names word w's column with `bits`: AND them into its prefix. */
static HOT_INLINE void and_pair(Walk *W, uint64_t p, const uint64_t *f, Py_ssize_t i, int *dropped) {
    uint64_t col = p >> 32;
    if (col >= (uint64_t)W->nc) return;
    int32_t w = W->colword[col];
    if (w < 0 || !W->acc[w]) return;
    uint64_t a = W->acc[w], now = a & (f ? (p & KV_LOW & f[col]) : (p & KV_LOW));
    if (now == a) return;
    record_ends(W, w, a & ~now, i);
    W->acc[w] = now;
    *dropped |= !now;
}

/* Page i names no pair of column col: its word's prefixes end here. */
static HOT_INLINE void end_column(Walk *W, uint64_t col, Py_ssize_t i, int *dropped) {
    if (col >= (uint64_t)W->nc) return;
    int32_t w = W->colword[col];
    if (w < 0 || !W->acc[w]) return;
    record_ends(W, w, W->acc[w], i);
    W->acc[w] = 0;
    *dropped = 1;
}

/* One view, one column per word, page i > 0 whose record is the last stepped page's with a few pairs
 * changed (a worker evicted, another one stored: the rest keep their places). A pair equal to the one
 * at its position before changes nothing (every prefix still matching is inside its bits already), so
 * only the changed positions are stepped: their new pairs AND into their words, and a column they no
 * longer name ends its word (a record's columns are distinct, so such a column is nowhere else on the
 * page). Same results as same_as_before + step_pairs; STEP_SAME, 1 while any word matches, 0 none,
 * DIFF_FALLBACK (inline pairs, records over 64 pairs, or more than DIFF_MAX changed: step_pairs), -1 on
 * a bad record. */
static HOT_INLINE int step_diff(Walk *W, uint64_t r, uint64_t p, Py_ssize_t i) {
    if (r == p) return STEP_SAME;
    if (r < KV_ROW_REF || p < KV_ROW_REF) return DIFF_FALLBACK;
    uint64_t *a = NULL, *b = NULL;
    Py_ssize_t na = 0, nb = 0;
    int cls;
    if (rec_open(&W->views[0], r, &a, &na, &cls) < 0 || rec_open(&W->views[0], p, &b, &nb, &cls) < 0) return -1;
    const Py_ssize_t m = na < nb ? na : nb, tail = na > nb ? na - nb : nb - na;
    if (tail > DIFF_MAX || m > 64) return DIFF_FALLBACK;
    Py_ssize_t at[DIFF_MAX], nd = 0;
    uint64_t changed = 0; /* the changed places as a mask, without a branch per place (they fall anywhere) */
    for (Py_ssize_t j = 0; j < m; j++) changed |= (uint64_t)(a[j] != b[j]) << j;
    if (POPCOUNT64(changed) + tail > DIFF_MAX) return DIFF_FALLBACK;
    for (; changed; changed &= changed - 1) at[nd++] = CTZ64(changed);
    if (!nd && !tail) return STEP_SAME;
    const uint64_t *f = W->filt[0];
    int dropped = 0;
    for (Py_ssize_t d = 0; d < nd; d++) and_pair(W, a[at[d]], f, i, &dropped);
    for (Py_ssize_t j = m; j < na; j++) and_pair(W, a[j], f, i, &dropped);
    for (Py_ssize_t d = 0; d < nd + (nb - m); d++) { /* the columns the page before named at changed places */
        uint64_t col = (d < nd ? b[at[d]] : b[m + d - nd]) >> 32;
        int named = 0;
        for (Py_ssize_t e = 0; e < nd && !named; e++) named = (a[at[e]] >> 32) == col;
        for (Py_ssize_t j = m; j < na && !named; j++) named = (a[j] >> 32) == col;
        if (!named) end_column(W, col, i, &dropped);
    }
    if (dropped) {
        Py_ssize_t kept = 0;
        for (Py_ssize_t t = 0; t < W->nact; t++)
            if (W->acc[W->act[t]]) W->act[kept++] = W->act[t];
        W->nact = kept;
    }
    return W->nact > 0;
}

/* Page i > 0 for layouts of one column per word: STEP_SAME, 1 while any word matches, 0, -1. */
static HOT_INLINE int step_next(Walk *W, const uint64_t *rw, Py_ssize_t k, Py_ssize_t i) {
    if (W->nv == 1) {
        int got = step_diff(W, rw[k], W->prev[0], i);
        if (got != DIFF_FALLBACK) return got;
    } else if (same_as_before(W, rw, k)) {
        return STEP_SAME;
    }
    return step_pairs(W, rw, k, i);
}

/* The pipelined walk, a page at a time: as page i is walked, page i + 3 BLOCK's buckets are prefetched,
 * page i + 2 BLOCK probed (its rows words prefetched) and page i + BLOCK's rows words read (its record
 * prefetched), so the misses are spread evenly instead of a block's worth at once (which stalls on the
 * line fill buffers). Workers still matching at the last page end there. */
/* With a feed, page j's hash is asked for just before the pipeline's first use of it (its bucket's
 * prefetch, 3 BLOCK pages ahead): each turn hashes one page and walks one. */
#define FEED_UPTO(W, upto) \
    do {                      \
        if ((W)->feed) kv_feed_upto((W)->feed, (upto)); \
    } while (0)

static int walk_pages(Walk *W) {
    const Py_ssize_t n = W->n;
    FEED_UPTO(W, 3 * BLOCK + 1);
    prefetch_keys(W, 0, 3 * BLOCK);
    if (probe_pages(W, 0, 2 * BLOCK) < 0) return -1;
    load_pages(W, 0, BLOCK);
    int going = 1;
    for (Py_ssize_t i = 0; i < n && going; i++) {
        FEED_UPTO(W, i + 3 * BLOCK + 1);
        prefetch_keys(W, i + 3 * BLOCK, i + 3 * BLOCK + 1);
        if (probe_pages(W, i + 2 * BLOCK, i + 2 * BLOCK + 1) < 0) return -1;
        load_pages(W, i + BLOCK, i + BLOCK + 1);
        const uint64_t *rw = W->rw + ring_at(W, i);
        const Py_ssize_t k = i % BLOCK;
        if (!W->credit) {
            going = i > 0 ? step_next(W, rw, k, i) : step_pairs(W, rw, k, i);
            if (going < 0) return -1;
            if (going == STEP_SAME) {
                going = 1;
                continue;
            }
        } else {
            if (spread_page(W, rw, k) < 0) return -1;
            going = step_words(W, i);
        }
        for (Py_ssize_t v = 0; v < W->nv; v++) W->prev[v] = rw[v * BLOCK + k];
    }
    for (Py_ssize_t w = 0; w < W->nw; w++) record_ends(W, w, W->acc[w], n);
    return 0;
}

/* ------------------------------------------------------------------ entry points */

/* One request on a prepared walk (`floats`: kv_walk_prepare's answer): its result, the running state
 * reset, the pages. */
int kv_walk_run(Walk *W, int floats) {
    if (kv_walk_result(W) < 0) return -1;
    if (!W->n || !W->nv || !W->nw) return 0;
    if (!floats) {
        Py_SETREF(W->result, Py_NewRef(Py_NotImplemented));
        return 0;
    }
    kv_walk_reset(W);
    if (walk_pages(W) < 0) return -1;
    return kv_walk_emit(W);
}

/* A walk of `hashes` with the bound arguments parsed and prepared for it alone (the views are opened
 * only when there are pages): `walk`, and BoundWalk's path for a call made while it is already walking. */
PyObject *kv_walk_once(PyObject *bound, PyObject *hashes) {
    Walk W;
    kv_walk_zero(&W);
    int floats = 1;
    if (kv_walk_parse_bound(&W, bound) < 0 || kv_walk_hashes(&W, hashes) < 0 ||
        (W.n && (floats = kv_walk_prepare(&W)) < 0) || kv_walk_run(&W, floats) < 0)
        Py_CLEAR(W.result);
    kv_walk_free(&W);
    return W.result;
}

/* walk(hashes, plan, layout, media, weights, PrefixMatch, WorkerMatch, builtin sum[, wm_fields, pm_fields])
 * -> PrefixMatch, or NotImplemented when the weights are not all floats; with PrefixMatch None, the
 * matched workers as columns (_walk_emit.c: bytes, empty when none matched) instead of objects.
 * plan: list of (cview, filter uint64[columns] or None); layout: list of WordLayout (word, cols, alive).
 * The twin of consumers.lookup.walk_plan: masks = OR over the plan of page_masks(t, hashes) & filter,
 * then consumers.lookup.walk(masks, ...). */
PyObject *kv_walk(PyObject *self, PyObject *args) {
    if (PyTuple_GET_SIZE(args) < 1) {
        PyErr_SetString(PyExc_ValueError, "walk takes the hashes and the walk's arguments");
        return NULL;
    }
    PyObject *bound = PyTuple_GetSlice(args, 1, PyTuple_GET_SIZE(args));
    if (!bound) return NULL;
    PyObject *out = kv_walk_once(bound, PyTuple_GET_ITEM(args, 0));
    Py_DECREF(bound);
    return out;
}
