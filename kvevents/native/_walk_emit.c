/* The walk's results (the twin of consumers/lookup.py's walk result): per worker word, in layout
 * order, its workers in the order their prefixes ended, as a PrefixMatch of WorkerMatches or, in
 * columns mode, as three native arrays in one bytes object. Reads the Walk that _walk.c filled. */
#include "_walk.h"

/* A single-medium word's match: pages, and pages x its weight (reused while consecutive workers share
 * them: ints and floats are immutable); bym gets {medium: pages}. New refs in *pg, *score. */
static int single_medium(Walk *W, Py_ssize_t mi, long long pages, PyObject *bym, PyObject **pg, PyObject **score) {
    if (!W->last_pg || pages != W->last_pages || mi != W->last_mi) {
        Py_CLEAR(W->last_pg);
        Py_CLEAR(W->last_score);
        W->last_pg = PyLong_FromLongLong(pages);
        W->last_score = W->last_pg ? PyFloat_FromDouble((double)pages * W->wts[mi]) : NULL;
        if (!W->last_score) return -1;
        W->last_pages = pages;
        W->last_mi = mi;
    }
    if (PyDict_SetItem(bym, PyList_GET_ITEM(W->media, mi), W->last_pg) < 0) return -1;
    Py_INCREF(W->last_pg);
    Py_INCREF(W->last_score);
    *pg = W->last_pg;
    *score = W->last_score;
    return 0;
}

/* A word of several columns: bym gets {medium: credited pages} in first-appearance order of the word's
 * columns (as the Python twin's dict), the score is sum() of the weighted terms. New refs. */
static int multi_media(Walk *W, Py_ssize_t w, int b, long long pages, PyObject *bym, PyObject **pg, PyObject **score) {
    PyObject *terms = PyList_New(0);
    if (!terms) return -1;
    const Py_ssize_t lo = W->wstart[w], hi = W->wstart[w + 1], *wmi = W->wmi;
    int ok = 1;
    for (Py_ssize_t c = lo; c < hi && ok; c++) {
        int first = 1;
        for (Py_ssize_t c2 = lo; c2 < c; c2++) if (wmi[c2] == wmi[c]) first = 0;
        if (!first) continue;
        int32_t k = W->credit[((size_t)w * W->nmedia + wmi[c]) * KV_WORD + b];
        if (!k) continue;
        PyObject *kk = PyLong_FromLong(k);
        PyObject *term = PyFloat_FromDouble(W->wts[wmi[c]] * (double)k);
        if (!kk || !term || PyDict_SetItem(bym, PyList_GET_ITEM(W->media, wmi[c]), kk) < 0 || PyList_Append(terms, term) < 0) ok = 0;
        Py_XDECREF(kk); Py_XDECREF(term);
    }
    *score = ok ? PyObject_CallOneArg(W->sum_fn, terms) : NULL;
    Py_DECREF(terms);
    *pg = *score ? PyLong_FromLongLong(pages) : NULL;
    if (!*pg) { Py_CLEAR(*score); return -1; }
    return 0;
}

/* WorkerMatch(pages, score, pages_by_medium): a new ref, or NULL. */
static PyObject *new_worker_match(const Walk *W, PyObject *argv[3]) {
    if (!W->wm_fields) return PyObject_Vectorcall(W->wm_cls, argv, 3, NULL);
    PyObject *wm = ((PyTypeObject *)W->wm_cls)->tp_alloc((PyTypeObject *)W->wm_cls, 0);
    for (int f = 0; wm && f < 3; f++) { /* the dataclass's three slots, fresh and zeroed: no old value to drop */
        Py_INCREF(argv[f]);
        *(PyObject **)((char *)wm + W->wm_off[f]) = argv[f];
    }
    /* it holds an int, a float and a dict of str -> int: it can be part of no cycle unless a caller
     * reassigns a field, so the cyclic GC need not track it (a lookup then adds 2 tracked objects
     * instead of ~20: fewer gen-0 collections inside lookups, which showed in the p99) */
    if (wm && PyObject_IS_GC(wm) && PyObject_GC_IsTracked(wm)) PyObject_GC_UnTrack(wm);
    return wm;
}

/* workers[word * 64 + b] = the WorkerMatch of word w's bit b. */
static int emit_worker(Walk *W, Py_ssize_t w, int b) {
    long long pages = W->ends[w * KV_WORD + b];
    PyObject *bym = PyDict_New(), *pg = NULL, *score = NULL;
    if (!bym) return -1;
    int rc = W->wstart[w + 1] - W->wstart[w] > 1 ? multi_media(W, w, b, pages, bym, &pg, &score)
                                                 : single_medium(W, W->wmi[W->wstart[w]], pages, bym, &pg, &score);
    if (rc < 0) { Py_DECREF(bym); return -1; }
    PyObject *argv[3] = {pg, score, bym};
    PyObject *wm = new_worker_match(W, argv);
    Py_DECREF(pg); Py_DECREF(score); Py_DECREF(bym);
    if (!wm) return -1;
    PyObject *wi = PyLong_FromLongLong(W->wword[w] * KV_WORD + b);
    rc = wi ? PyDict_SetItem(W->workers, wi, wm) : -1;
    Py_XDECREF(wi); Py_DECREF(wm);
    return rc;
}

/* Columns mode: the matched workers as bytes of three native arrays of equal length: worker index
 * (int64), prefix pages (int64), score (float64), in the order PrefixMatch.workers would list them. */
static int emit_columns(Walk *W, Py_ssize_t total) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, total * 24);
    if (!out) return -1;
    int64_t *wi = (int64_t *)PyBytes_AS_STRING(out), *pg = wi + total;
    double *sc = (double *)(pg + total);
    Py_ssize_t k = 0;
    for (Py_ssize_t w = 0; w < W->nw; w++)
        for (int e = 0; e < W->nend[w]; e++, k++) {
            int b = W->endorder[w * KV_WORD + e];
            long long pages = W->ends[w * KV_WORD + b];
            wi[k] = W->wword[w] * KV_WORD + b;
            pg[k] = pages;
            if (W->wstart[w + 1] - W->wstart[w] == 1) {
                sc[k] = (double)pages * W->wts[W->wmi[W->wstart[w]]];
                continue;
            }
            PyObject *bym = PyDict_New(), *p = NULL, *s = NULL; /* the twin's sum() of the weighted terms */
            if (!bym || multi_media(W, w, b, pages, bym, &p, &s) < 0) { Py_XDECREF(bym); Py_DECREF(out); return -1; }
            sc[k] = PyFloat_AsDouble(s);
            Py_DECREF(bym); Py_DECREF(p); Py_DECREF(s);
        }
    Py_SETREF(W->result, out);
    return 0;
}

/* The results, word by word in layout order, workers in the order their prefixes ended. */
int kv_walk_emit(Walk *W) {
    if (W->pm_cls == Py_None) {
        Py_ssize_t total = 0;
        for (Py_ssize_t w = 0; w < W->nw; w++) total += W->nend[w];
        return total ? emit_columns(W, total) : 0;
    }
#if PY_VERSION_HEX < 0x030D0000
    Py_ssize_t total = 0;
    for (Py_ssize_t w = 0; w < W->nw; w++) total += W->nend[w];
    if (W->pm_fields && total > 5 && PyDict_GET_SIZE(W->workers) == 0) { /* sized once, not grown 8 -> 16 -> 32 -> 64 */
        PyObject *sized = _PyDict_NewPresized(total), *d1 = PyTuple_GET_ITEM(W->pm_fields, 1);
        if (!sized || Py_TYPE(d1)->tp_descr_set(d1, W->result, sized) < 0) { Py_XDECREF(sized); return -1; }
        Py_SETREF(W->workers, sized);
    }
#endif
    for (Py_ssize_t w = 0; w < W->nw; w++)
        for (int e = 0; e < W->nend[w]; e++)
            if (emit_worker(W, w, W->endorder[w * KV_WORD + e]) < 0) return -1;
    return 0;
}
