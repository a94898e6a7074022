/* Private header of kvevents.native._speedups: what its C files share (the module map is in
 * kvevents/native/__init__.py). The argument helpers (_speedups.c), compiler hints, and the functions
 * each file adds to the module's method table. Every symbol here is hidden: the extension exports
 * only PyInit__speedups. */
#ifndef KVEVENTS_NATIVE_H
#define KVEVENTS_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 3)
#define HOT_INLINE inline __attribute__((always_inline))
#define COLD __attribute__((noinline, cold))
#define CTZ64(x) __builtin_ctzll(x)
#define POPCOUNT64(x) __builtin_popcountll(x)
#define KV_HIDDEN __attribute__((visibility("hidden")))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define UNLIKELY(x) (x)
#define PREFETCH(p) ((void)0)
#define HOT_INLINE inline
#define COLD
#define KV_HIDDEN
static inline int CTZ64(uint64_t x) { int n = 0; while (!(x & 1)) { x >>= 1; n++; } return n; }
static inline int POPCOUNT64(uint64_t x) { int n = 0; for (; x; x &= x - 1) n++; return n; }
#endif

#define MAX_PAGES ((Py_ssize_t)1 << 40) /* more pages (or tokens) than any argument may hold */
#define RELEASE_GIL_BYTES ((Py_ssize_t)1 << 20) /* inputs from 1 MiB are read with the GIL let go (~1-2.5 ms) */

/* _speedups.c: argument helpers (ValueError naming `what` on a bad argument) */
KV_HIDDEN int kv_get_buf(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, const char *kinds, int writable,
                         const char *what);
KV_HIDDEN int kv_as_i64(PyObject *o, int64_t *out, const char *what);

/* _chain.c: the contract's page chain (SHA-256, packing, int64) */
KV_HIDDEN void kv_chain_init(void);
KV_HIDDEN PyObject *kv_chain_pages(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_chain_packed(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_digests_int64(PyObject *self, PyObject *arg);
KV_HIDDEN PyObject *kv_pack_u32(PyObject *self, PyObject *arg);
KV_HIDDEN PyObject *kv_chain_list(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_pack_json_u32(PyObject *self, PyObject *arg); /* _json.c */
KV_HIDDEN PyObject *kv_split_json_tokens(PyObject *self, PyObject *arg); /* _json.c */
KV_HIDDEN PyObject *kv_sha_impl_name(PyObject *self, PyObject *noargs);
KV_HIDDEN PyObject *kv_select_sha(PyObject *self, PyObject *arg);

/* _table.c: the table layout, exported for the import-time check */
KV_HIDDEN PyObject *kv_layout(PyObject *self, PyObject *noargs);

/* _walk_layout.c, _walk_args.c, _walk.c: the index walk */
KV_HIDDEN int kv_walk_init(void);
KV_HIDDEN PyObject *kv_walk(PyObject *self, PyObject *args);
KV_HIDDEN int kv_bound_walk_ready(PyObject *module); /* adds the BoundWalk type (_walk_bound.c) */
KV_HIDDEN PyObject *kv_pack_layout(PyObject *self, PyObject *layout); /* _walk_layout.c */

/* _rows.c: the /score answer's ranking order, and its worker objects from the ranking's columns */
KV_HIDDEN int kv_rows_init(void);
KV_HIDDEN PyObject *kv_score_rows(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_cost_order(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_prefix_rank(PyObject *self, PyObject *args);

/* _apply.c: the store, remove and clear loops */
KV_HIDDEN PyObject *kv_all_int64(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_set_bits_each(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_remove_each(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_clear_worker(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_store_event(PyObject *self, PyObject *args);
KV_HIDDEN PyObject *kv_holds_bit(PyObject *self, PyObject *args);

#endif
