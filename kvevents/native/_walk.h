/* The index walk's state, shared by _walk_args.c (arguments parsed, checked and flattened into a Walk)
 * and _walk.c (the pipelined walk over the pages, and its results). */
#ifndef KVEVENTS_WALK_H
#define KVEVENTS_WALK_H

#include "_table.h"

#define BLOCK 16 /* pages per pipeline step */

/* One walk's arguments, views, flattened layout, running state and result. On the stack: only the
 * scalars and pointers are initialised (kv_walk_zero), never the view arrays (~37 KB). */
typedef struct {
    PyObject *plan, *layout, *media, *weights, *pm_cls, *wm_cls, *sum_fn, *wm_fields, *pm_fields;
    Py_ssize_t wm_off[3]; /* where WorkerMatch's (pages, score, pages_by_medium) slots live */
    Py_buffer hb;
    int hb_held;
    const int64_t *q; /* the request's page hashes */
    Py_ssize_t n, nv, nw, nmedia, nc;
    View views[MAX_VIEWS];
    Py_buffer fb[MAX_VIEWS];
    const uint64_t *filt[MAX_VIEWS]; /* per view: a filter of nc words, or NULL */
    int nloaded;                     /* views[0..nloaded) are held (and fb[i] where filt[i]) */
    /* per word w: columns wcols/wmi[wstart[w]..wstart[w+1]), word number, alive bits, running AND */
    Py_ssize_t *wcols, *wmi, *wstart;
    int64_t *wword;
    uint64_t *walive, *acc, *row;
    int32_t *ends, *credit, *nend; /* per word and bit: the page its prefix ended at, pages per medium */
    uint8_t *endorder;             /* per word: bits in the order their prefixes ended */
    Py_ssize_t *slots;             /* two blocks of probed slots per view */
    double *wts;
    void *scratch;
    PyObject *result, *workers;
    PyObject *last_pg, *last_score; /* shared by consecutive workers with the same single-medium match */
    long long last_pages;
    Py_ssize_t last_mi;
} Walk;

/* _walk_args.c: each 0, or -1 with an exception (kv_walk_weights: 1 all floats, 0 not) */
KV_HIDDEN void kv_walk_zero(Walk *W);
KV_HIDDEN void kv_walk_free(Walk *W);
KV_HIDDEN int kv_walk_parse(Walk *W, PyObject *args);
KV_HIDDEN int kv_walk_result(Walk *W);
KV_HIDDEN int kv_walk_plan(Walk *W);
KV_HIDDEN int kv_walk_weights(Walk *W);
KV_HIDDEN int kv_walk_layout(Walk *W);

#endif
