/* The index walk's state, shared by _walk_args.c (arguments parsed, checked and flattened into a Walk)
 * and _walk.c (the pipelined walk over the pages, and its results). */
#ifndef KVEVENTS_WALK_H
#define KVEVENTS_WALK_H

#include "_feed.h"
#include "_holders.h"

#define BLOCK 16 /* pages per pipeline step */
#define MAX_WALK_COLUMNS ((Py_ssize_t)1 << 24) /* columns a walk's row buffer may span */
#define RING 4   /* blocks in flight: keys prefetched, probed (rows prefetched), rows read (records prefetched), walked */

/* One walk's arguments, views, flattened layout, running state and result. Only the scalars and
 * pointers are initialised (kv_walk_zero); the per-view arrays are allocated for the plan's views. */
typedef struct {
    PyObject *plan, *layout, *media, *weights, *pm_cls, *wm_cls, *sum_fn, *wm_fields, *pm_fields;
    Py_ssize_t wm_off[3]; /* where WorkerMatch's (pages, score, pages_by_medium) slots live */
    Py_buffer hb;
    int hb_held;
    const int64_t *q; /* the request's page hashes */
    KvFeed *feed;     /* or NULL: q is whole; else q fills as the feed hashes (walk_pages asks it ahead) */
    Py_ssize_t n, nv, nw, nmedia, nc; /* nc: columns (the filters' length, else 1 + the layout's largest) */
    View *views;                      /* the plan's views */
    Py_buffer *fb;
    const uint64_t **filt; /* per view: a filter of nc words, or NULL */
    int nloaded;           /* views[0..nloaded) are held (and fb[i] where filt[i]) */
    /* per word w: columns wcols/wmi[wstart[w]..wstart[w+1]), word number, alive bits, running AND */
    Py_ssize_t *wcols, *wmi, *wstart;
    int64_t *wword;
    uint64_t *walive, *acc, *row; /* row: one page's bits per column (read and zeroed by the words) */
    int32_t *colword;             /* per column: its word in the layout, or -1 */
    Py_ssize_t *act, nact;        /* the words still matching */
    int32_t *ends, *credit, *nend; /* per word and bit: the page its prefix ended at, pages per medium */
    uint8_t *endorder;             /* per word: bits in the order their prefixes ended */
    Py_ssize_t *slots;             /* RING blocks of probed slots per view */
    uint64_t *rw;                  /* RING blocks of rows words per view */
    uint64_t *prev;                /* per view: the rows word of the last page stepped */
    uint64_t *held;                /* per word: a page's bits, OR-ed over its pairs (step_pairs) */
    Py_ssize_t *touch;             /* the words a page's pairs named, in the order they came */
    uint32_t *stampw, tick;        /* per word: the page count when a pair last named it; pages stepped */
    double *wts;
    void *scratch;
    PyObject *result, *workers;
    PyObject *last_pg, *last_score; /* shared by consecutive workers with the same single-medium match */
    long long last_pages;
    Py_ssize_t last_mi;
} Walk;

/* A packed layout (bytes of int64): a header (words, columns in all), then per word its number, alive
 * bits and first column, one more start (the total), then per column its number and medium index. */
enum { LAY_NW, LAY_NTOT, LAY_HEAD };

/* _walk_layout.c: pack a list of WordLayouts once (kv_pack_layout), check a packed one (its words, or -1) */
KV_HIDDEN int kv_layout_init(void);
KV_HIDDEN Py_ssize_t kv_layout_words(PyObject *packed);

/* _walk_args.c: each 0, or -1 with an exception (kv_walk_weights: 1 all floats, 0 not) */
KV_HIDDEN void kv_walk_zero(Walk *W);
KV_HIDDEN void kv_walk_free(Walk *W);
KV_HIDDEN int kv_walk_parse_bound(Walk *W, PyObject *bound);
KV_HIDDEN int kv_walk_result(Walk *W);
KV_HIDDEN int kv_walk_plan(Walk *W);
KV_HIDDEN int kv_walk_weights(Walk *W);
KV_HIDDEN int kv_walk_layout(Walk *W);
/* A walk's two halves, run together by `walk` and apart by BoundWalk (_walk_bound.c): kv_walk_prepare
 * opens the views, reads the weights and flattens the layout (1 ready, 0 weights not all floats, -1
 * error); per request kv_walk_hashes, kv_walk_run (_walk.c: the result, kv_walk_reset of the running
 * state, the pages), kv_walk_end_call. */
KV_HIDDEN int kv_walk_hashes(Walk *W, PyObject *hashes);
KV_HIDDEN int kv_walk_prepare(Walk *W);
KV_HIDDEN void kv_walk_reset(Walk *W);
KV_HIDDEN void kv_walk_end_call(Walk *W);
KV_HIDDEN int kv_walk_run(Walk *W, int floats);
KV_HIDDEN PyObject *kv_walk_once(PyObject *bound, PyObject *hashes);
/* _walk_emit.c: the walk's result (W->result, or the PrefixMatch's workers dict) from its ends; 0, or -1 */
KV_HIDDEN int kv_walk_emit(Walk *W);

#endif
