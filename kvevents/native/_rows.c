/* The /score answer's ranking order (cost_order: twin np.lexsort in consumers/cost.py) and its worker
 * objects built from the ranking's columns (score_rows: twin rows_py in consumers/service/answer_rows.py):
 * each row a copy of one template dict with its numbers set, so a row costs a dict copy and a few
 * stores instead of fifteen inserts and a Python frame. */
#include "_native.h"
#include <math.h>

/* the keys a row sets, interned once (their hashes are cached, so each store is one probe) */
static PyObject *k_worker, *k_dp, *k_cost, *k_score, *k_pages, *k_tokens, *k_overlap, *k_predicted;

int kv_rows_init(void) {
    return (k_worker = PyUnicode_InternFromString("worker")) && (k_dp = PyUnicode_InternFromString("dp_rank")) &&
                   (k_cost = PyUnicode_InternFromString("cost")) && (k_score = PyUnicode_InternFromString("score")) &&
                   (k_pages = PyUnicode_InternFromString("matched_pages")) &&
                   (k_tokens = PyUnicode_InternFromString("matched_tokens")) &&
                   (k_overlap = PyUnicode_InternFromString("overlap_blocks")) &&
                   (k_predicted = PyUnicode_InternFromString("predicted_blocks"))
               ? 0
               : -1;
}

/* x to 6 decimals as the twin rounds it: int(x * 1e6 + 0.5) / 1e6 below 1e15, else x itself. */
static inline double round6(double x) { return x < 1e15 ? trunc(x * 1e6 + 0.5) / 1e6 : x; }

/* d[key] = value, stealing the new reference `value` (NULL: an error already set). */
static inline int put(PyObject *d, PyObject *key, PyObject *value) {
    if (!value) return -1;
    int rc = PyDict_SetItem(d, key, value);
    Py_DECREF(value);
    return rc;
}

typedef struct {
    Py_buffer b[6]; /* worker, at, cost (n each); matched pages, matched score (nm each); predicted (n) */
    int held;       /* buffers acquired, in that order (predicted only when it is not None) */
    Py_ssize_t n, nm;
} Cols;

static void cols_free(Cols *c) {
    for (int i = 0; i < c->held; i++) PyBuffer_Release(&c->b[i]);
}

/* The numeric columns: the row columns n items long (n: the worker column's), the match columns nm. */
static int cols_get(Cols *c, PyObject *const objs[6]) {
    static const char *kinds[6] = {"ql", "ql", "d", "ql", "d", "ql"};
    static const char *what[6] = {"worker", "at", "cost", "matched_pages", "matched_score", "predicted"};
    c->held = 0;
    for (int i = 0; i < 6; i++) {
        if (i == 5 && objs[i] == Py_None) break;
        if (kv_get_buf(objs[i], &c->b[i], 8, kinds[i], 0, what[i]) < 0) return -1;
        c->held++;
        Py_ssize_t len = c->b[i].len / 8;
        if (i == 0) c->n = len;
        if (i == 3) c->nm = len;
        if (len != (i == 3 || i == 4 ? c->nm : c->n)) {
            PyErr_Format(PyExc_ValueError, "score_rows: column %s has %zd items, not %zd", what[i], len,
                         i == 4 ? c->nm : c->n);
            return -1;
        }
    }
    return 0;
}

#define COL(c, k, T) ((const T *)(c)->b[k].buf)

/* The last value made for each numeric field: consecutive rows often agree (every worker holding the
 * whole request has the same pages, tokens, score and cost), and ints and floats are immutable. */
typedef struct {
    PyObject *obj[6];
    double val[6];
    int set[6];
    PyObject *tmpl_dp; /* the template's dp_rank (borrowed): a row whose rank is that object keeps it */
    int tmpl_no_pred;  /* the template's predicted_blocks is int 0: a row without predicted pages keeps it */
} Reuse;

enum { R_COST, R_SCORE, R_PAGES, R_TOKENS, R_OVERLAP, R_PREDICTED };

static void reuse_free(Reuse *r) {
    for (int f = 0; f < 6; f++) Py_CLEAR(r->obj[f]);
}

/* A new reference to field f's value x (a float for cost and score, else an int), reused when the last
 * one made for f was x. */
static PyObject *value(Reuse *r, int f, double x, long long n) {
    if (!r->set[f] || r->val[f] != x || (f <= R_SCORE && signbit(r->val[f]) != signbit(x))) {
        PyObject *o = f <= R_SCORE ? PyFloat_FromDouble(x) : PyLong_FromLongLong(n);
        if (!o) return NULL;
        Py_XSETREF(r->obj[f], o);
        r->val[f] = x;
        r->set[f] = 1;
    }
    return Py_NewRef(r->obj[f]);
}

/* One row: a copy of the template with the worker's identity and numbers, then the extra columns. */
static PyObject *one_row(PyObject *tmpl, PyObject *src, PyObject *dp, const Cols *c, Py_ssize_t i,
                         long long page_size, PyObject *names, PyObject *extra, Reuse *r) {
    const int64_t at = COL(c, 1, int64_t)[i];
    const int matched = at >= 0 && at < c->nm;
    const long long pages = matched ? COL(c, 3, int64_t)[at] : 0;
    const double score = round6(matched ? COL(c, 4, double)[at] : 0.0), cost = round6(COL(c, 2, double)[i]);
    const long long more = c->held == 6 ? COL(c, 5, int64_t)[i] : 0, tokens = pages * page_size;
    PyObject *d = PyDict_Copy(tmpl);
    if (!d) return NULL;
    if (PyDict_SetItem(d, k_worker, src) < 0 || (dp != r->tmpl_dp && PyDict_SetItem(d, k_dp, dp) < 0) ||
        put(d, k_cost, value(r, R_COST, cost, 0)) < 0 || put(d, k_score, value(r, R_SCORE, score, 0)) < 0 ||
        put(d, k_pages, value(r, R_PAGES, (double)pages, pages)) < 0 ||
        put(d, k_tokens, value(r, R_TOKENS, (double)tokens, tokens)) < 0 ||
        put(d, k_overlap, value(r, R_OVERLAP, (double)(pages + more), pages + more)) < 0 ||
        ((more || !r->tmpl_no_pred) && put(d, k_predicted, value(r, R_PREDICTED, (double)more, more)) < 0))
        goto fail;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(names); j++)
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(names, j), PyList_GET_ITEM(PyTuple_GET_ITEM(extra, j), i)) < 0) goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* Ahead of row i: the list slots of row i + 8's worker (in sources and dp_ranks), then row i + 4's name
 * (its slot fetched by then). Two steps because after a walk over a big index both are cold misses and
 * each row's stores need them. */
static inline void prefetch_names(PyObject *sources, PyObject *dps, const int64_t *wi, Py_ssize_t i, Py_ssize_t n) {
    const Py_ssize_t nsrc = PyList_GET_SIZE(sources);
    if (i + 8 < n && wi[i + 8] >= 0 && wi[i + 8] < nsrc) {
        PREFETCH(&((PyListObject *)sources)->ob_item[wi[i + 8]]);
        PREFETCH(&((PyListObject *)dps)->ob_item[wi[i + 8]]);
    }
    if (i + 4 < n && wi[i + 4] >= 0 && wi[i + 4] < nsrc) PREFETCH(PyList_GET_ITEM(sources, wi[i + 4]));
}

/* score_rows(template, sources, dp_ranks, worker, at, cost, matched_pages, matched_score, predicted, page_size,
 * names, extra) -> list of dicts, one per row i: template's copy with worker = sources[worker[i]],
 * dp_rank = dp_ranks[worker[i]], cost[i] and the score rounded to 6 decimals, matched_pages, matched_tokens
 * (pages x page_size), overlap_blocks (pages + predicted), predicted_blocks (predicted[i]; None: 0), then
 * names[j] = extra[j][i] (lists as long as the rows). A row's pages and score are the match columns'
 * at[i] when 0 <= at[i] < their length, else 0 (a worker listed without a match). */
PyObject *kv_score_rows(PyObject *self, PyObject *args) {
    PyObject *tmpl, *sources, *dps, *names, *extra, *objs[6];
    long long page_size;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOOLO!O!", &PyDict_Type, &tmpl, &PyList_Type, &sources, &PyList_Type, &dps,
                          &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &page_size, &PyTuple_Type,
                          &names, &PyTuple_Type, &extra))
        return NULL;
    if (PyList_GET_SIZE(sources) != PyList_GET_SIZE(dps) || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(extra)) {
        PyErr_SetString(PyExc_ValueError, "score_rows: sources and dp_ranks, names and extra differ in length");
        return NULL;
    }
    Cols c;
    if (cols_get(&c, objs) < 0) { cols_free(&c); return NULL; }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(extra); j++) {
        PyObject *col = PyTuple_GET_ITEM(extra, j);
        if (!PyList_Check(col) || PyList_GET_SIZE(col) != c.n) {
            PyErr_Format(PyExc_ValueError, "score_rows: extra column %zd is not a list of %zd items", j, c.n);
            cols_free(&c);
            return NULL;
        }
    }
    PyObject *out = PyList_New(c.n);
    Reuse reuse = {{NULL}, {0}, {0}, PyDict_GetItemWithError(tmpl, k_dp), 0};
    PyObject *tp = reuse.tmpl_dp || !PyErr_Occurred() ? PyDict_GetItemWithError(tmpl, k_predicted) : NULL;
    reuse.tmpl_no_pred = tp && PyLong_CheckExact(tp) && PyLong_AsLongLong(tp) == 0;
    if (PyErr_Occurred()) { Py_XDECREF(out); cols_free(&c); return NULL; }
    const int64_t *wi = COL(&c, 0, int64_t);
    const Py_ssize_t nsrc = PyList_GET_SIZE(sources);
    for (Py_ssize_t i = 0; i < 8 && i < c.n; i++)  /* the first rows' slots (prefetch_names takes it from there) */
        if (wi[i] >= 0 && wi[i] < nsrc) PREFETCH(&((PyListObject *)sources)->ob_item[wi[i]]);
    for (Py_ssize_t i = 0; out && i < c.n; i++) {
        if (wi[i] < 0 || wi[i] >= nsrc) {
            PyErr_Format(PyExc_ValueError, "score_rows: worker %lld is not in 0..%zd", (long long)wi[i], nsrc - 1);
            Py_CLEAR(out);
            break;
        }
        prefetch_names(sources, dps, wi, i, c.n);
        PyObject *row = one_row(tmpl, PyList_GET_ITEM(sources, wi[i]), PyList_GET_ITEM(dps, wi[i]), &c, i, page_size,
                                names, extra, &reuse);
        if (!row) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, row);
    }
    reuse_free(&reuse);
    cols_free(&c);
    return out;
}

/* ------------------------------------------------------------------ the ranking's order */

typedef struct {
    uint64_t key, tie;
    Py_ssize_t at;
} Ranked;

/* A cost as a key whose unsigned order is the cost's order, NaN after every number (as numpy sorts). */
static inline uint64_t cost_key(double c) {
    if (c != c) return UINT64_MAX;
    if (c == 0) c = 0; /* -0.0 sorts as 0.0 */
    uint64_t u;
    memcpy(&u, &c, 8);
    return u >> 63 ? ~u : u | (1ull << 63);
}

static inline int ranked_before(const Ranked *a, const Ranked *b) {
    return a->key < b->key || (a->key == b->key && a->tie < b->tie);
}

/* Bottom-up merge sort of r[0..n) by (key, tie) through tmp (stable; the compare inlined: qsort's
 * call per compare cost more than the sort itself for the ~100 rows of an answer). */
static Ranked *merge_sort(Ranked *r, Ranked *tmp, Py_ssize_t n) {
    for (Py_ssize_t w = 1; w < n; w *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * w) {
            Py_ssize_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = ranked_before(&r[j], &r[i]) ? r[j++] : r[i++];
            while (i < mid) tmp[k++] = r[i++];
            while (j < hi) tmp[k++] = r[j++];
        }
        Ranked *t = r;
        r = tmp;
        tmp = t;
    }
    return r;
}

/* A worker's tie order under the request's salt: ((worker + 1) ^ salt) * 0x9E3779B97F4A7C15 mod 2**64. */
static inline uint64_t tie_of(int64_t worker, uint64_t salt) { return (((uint64_t)worker + 1) ^ salt) * 0x9E3779B97F4A7C15ull; }

/* The two columns both rankings take: 8-byte floats x and int64 workers of one length n (ValueError
 * naming `fn` otherwise); 0, or -1 with both released. */
static int rank_columns_get(PyObject *xo, PyObject *wo, const char *fn, const char *xname, Py_buffer *xb, Py_buffer *wb) {
    if (kv_get_buf(xo, xb, 8, "d", 0, xname) < 0) return -1;
    if (kv_get_buf(wo, wb, 8, "ql", 0, "worker") < 0) { PyBuffer_Release(xb); return -1; }
    if (wb->len != xb->len) {
        PyErr_Format(PyExc_ValueError, "%s: %zd %ss but %zd workers", fn, xb->len / 8, xname, wb->len / 8);
        PyBuffer_Release(xb);
        PyBuffer_Release(wb);
        return -1;
    }
    return 0;
}

/* cost_order(cost, worker, salt) -> bytes of native intp: the rows' order by (cost, tie order) (numpy's
 * lexsort of the two, without building the tie column). */
PyObject *kv_cost_order(PyObject *self, PyObject *args) {
    PyObject *co, *wo;
    unsigned long long salt;
    if (!PyArg_ParseTuple(args, "OOK", &co, &wo, &salt)) return NULL;
    Py_buffer cb, wb;
    if (rank_columns_get(co, wo, "cost_order", "cost", &cb, &wb) < 0) return NULL;
    const Py_ssize_t n = cb.len / 8;
    PyObject *out = NULL;
    Ranked *r = PyMem_Malloc(2 * sizeof(Ranked) * (size_t)(n ? n : 1));
    if (!r) {
        PyErr_NoMemory();
    } else {
        const double *c = cb.buf;
        const int64_t *w = wb.buf;
        for (Py_ssize_t i = 0; i < n; i++) r[i] = (Ranked){cost_key(c[i]), tie_of(w[i], salt), i};
        const Ranked *sorted = merge_sort(r, r + n, n);
        out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(Py_ssize_t));
        if (out) {
            Py_ssize_t *o = (Py_ssize_t *)PyBytes_AS_STRING(out);
            for (Py_ssize_t i = 0; i < n; i++) o[i] = sorted[i].at;
        }
    }
    PyMem_Free(r);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&wb);
    return out;
}

/* prefix_rank(have, worker, request_pages, scale, salt) -> bytes: the ranking without loads in one call.
 * Row i costs max(request_pages - have[i], 0) * scale (as numpy's maximum: NaN stays NaN); the rows are
 * ordered by (cost, tie order), and the result is their workers (int64), costs (float64) and positions
 * in the input (intp), n of each, concatenated. Twin: consumers/cost.py (np.maximum, then lexsort). */
PyObject *kv_prefix_rank(PyObject *self, PyObject *args) {
    PyObject *ho, *wo;
    double pages, scale;
    unsigned long long salt;
    if (!PyArg_ParseTuple(args, "OOddK", &ho, &wo, &pages, &scale, &salt)) return NULL;
    Py_buffer hb, wb;
    if (rank_columns_get(ho, wo, "prefix_rank", "have", &hb, &wb) < 0) return NULL;
    const Py_ssize_t n = hb.len / 8;
    PyObject *out = NULL;
    Ranked *r = PyMem_Malloc(2 * sizeof(Ranked) * (size_t)(n ? n : 1));
    double *cost = PyMem_Malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!r || !cost) {
        PyErr_NoMemory();
    } else {
        const double *have = hb.buf;
        const int64_t *w = wb.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            const double d = pages - have[i];
            cost[i] = (d >= 0.0 || d != d ? d : 0.0) * scale;
            r[i] = (Ranked){cost_key(cost[i]), tie_of(w[i], salt), i};
        }
        const Ranked *sorted = merge_sort(r, r + n, n);
        out = PyBytes_FromStringAndSize(NULL, n * 24);
        if (out) {
            int64_t *ow = (int64_t *)PyBytes_AS_STRING(out);
            double *oc = (double *)(ow + n);
            Py_ssize_t *oa = (Py_ssize_t *)(oc + n);
            for (Py_ssize_t i = 0; i < n; i++) {
                const Py_ssize_t at = sorted[i].at;
                ow[i] = w[at];
                oc[i] = cost[at];
                oa[i] = at;
            }
        }
    }
    PyMem_Free(r);
    PyMem_Free(cost);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&wb);
    return out;
}
