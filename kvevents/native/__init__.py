"""Which implementation runs the hot loops: the optional C extension or the pure-Python twins.

The one place that decides. kvevents.native._speedups (built by setup.py when a C compiler is present)
runs the SHA-256 page chain, the index walk and the store/remove loops; the pure-Python code in
kvevents._chain and consumers.* gives identical results and is used when the extension is missing,
when its table layout differs from the Python table's (refused at import, said once on stderr),
when KVEVENTS_PURE_PYTHON=1 is set, or inside `python_only()` (tests, benchmarks).
Callers ask `active()` and call the functions below; nothing else imports the extension.

| file | owns |
|------|------|
| `__init__.py` | the switch: `active()`, `describe()`, the layout check, typed wrappers of the extension |
| `layout.py` | the HashTable layout consumers/table.py and the C share (slots, state bits, mix, view fields) |
| `_speedups.pyi` | the extension's typed signatures (what mypy checks the wrappers against) |
| `_native.h` | the C files' private header: argument helpers, compiler hints, the method table's functions |
| `_speedups.c` | the module: method table, init, argument helpers |
| `_chain.c`, `_sha256.h` | the contract's page chain: SHA-256 (SHA-NI or portable), token packing, int64 |
| `_feed.h` | a chain hashed a page at a time as the walk asks (its code in `_chain.c`: the one file with SHA-256) |
| `_json.c` | the /score body's JSON token-id array read straight into packed uint32, and found in the body (split_json_tokens) |
| `_table.h`, `_table.c` | a table view as C reads it, the probe of one key, the layout export |
| `_holders.h` | a slot's holders: its rows word, pool records, set/clear one bit (twin of consumers/holders.py) |
| `_walk.h`, `_walk_args.c` | the walk's state; its arguments parsed, checked and flattened |
| `_walk_layout.c` | the walk's WordLayouts packed once into one buffer (a lookup reads no attribute) |
| `_walk.c` | the index walk: pipelined probes, per-word AND, a page stepped against the page before (twin of lookup.py's walk_plan) |
| `_walk_emit.c` | the walk's results: PrefixMatch of WorkerMatches, or the matched workers as columns |
| `_walk_bound.c` | BoundWalk: a walk prepared once (views open, layout flattened), called per request's hashes, or fed its packed ids (`packed`: hashed as it walks) |
| `_rows.c` | the /score answer: its ranking order and its ranking without loads (`prefix_rank`) (twins in consumers/cost.py), and worker dicts from the ranking's columns (twin in consumers/service/answer_rows.py) |
| `_apply.c` | the store/remove/clear loops and one-key checks (twins in consumers/table.py, copies.py, indexer.py) |
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import os
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kvevents.native.layout import mismatch as layout_mismatch

try:
    from kvevents.native import _speedups as _c
except ImportError:  # no compiler at install time, or a pure-Python install
    HAVE_C: bool = False
else:
    HAVE_C = True

__all__ = [
    "HAVE_C",
    "REFUSED",
    "refusal",
    "active",
    "describe",
    "python_only",
    "chain_pages",
    "chain_packed",
    "digests_int64",
    "walk",
    "set_bits_each",
    "pack_u32",
    "pack_json_u32",
    "split_json_tokens",
    "all_int64",
    "chain_list",
    "portable_sha",
    "remove_each",
    "clear_worker",
    "store_event",
    "holds_bit",
    "sha_impl",
    "bind_walk",
    "bind_walk_columns",
    "score_rows",
    "cost_order",
    "prefix_rank",
]


def refusal(c_layout: Mapping[str, object]) -> str | None:
    """Why an extension exporting `c_layout` must not run (its table layout is not the Python
    table's), as the one line said on stderr; None when the layouts agree."""
    diff = layout_mismatch(c_layout)
    if diff is None:
        return None
    return (
        f"kvevents: the C extension was built for another table layout ({diff}); the pure-Python "
        "fallback is in use (rebuild it: python3 setup.py build_ext --inplace)"
    )


#: HAVE_C: True when the compiled extension imported (whether or not it runs).
#: REFUSED: why an imported extension does not run (its table layout differs), else None.
REFUSED: str | None = refusal(_c.layout()) if HAVE_C else None
if REFUSED:
    logging.getLogger(__name__).warning(REFUSED)
_on: bool = HAVE_C and REFUSED is None and os.environ.get("KVEVENTS_PURE_PYTHON", "") not in ("1", "true", "yes")


def active() -> bool:
    """True when the compiled fast path runs (built, and not switched off)."""
    return _on


def describe() -> str:
    """One line for `kvevents --version` and `kvevents doctor`: which path runs, and why."""
    if _on:
        return f"speedups: C extension (SHA-256 {sha_impl()})"
    if REFUSED:
        return "speedups: pure Python (C extension refused: built for another table layout)"
    if HAVE_C:
        return "speedups: pure Python (C extension switched off by KVEVENTS_PURE_PYTHON)"
    return "speedups: pure Python (C extension not built)"


def sha_impl() -> str:
    """The C SHA-256 compression in use ('sha-ni' or 'portable'), or 'hashlib' without the extension."""
    return _c.sha_impl() if HAVE_C else "hashlib"


@contextmanager
def python_only() -> Iterator[None]:
    """Run the block with the pure-Python paths (differential tests, fallback benchmarks)."""
    global _on
    was, _on = _on, False
    try:
        yield
    finally:
        _on = was


@contextmanager
def portable_sha() -> Iterator[None]:
    """Run the block with the portable C SHA-256 compression instead of SHA-NI (tests)."""
    if not HAVE_C:
        yield
        return
    _c.select_sha(False)
    try:
        yield
    finally:
        _c.select_sha(True)


def pack_u32(token_ids: list) -> bytes | None:
    """Little-endian uint32 bytes of a list of ints, or None when one is not in 0..2**32-1."""
    return _c.pack_u32(token_ids)


def pack_json_u32(text: Any) -> bytes | None:
    """Little-endian uint32 bytes of a JSON array of plain token ids (digits only, 0..2**32-1), or
    None for any other text (twin: consumers.score_body.pack_json_ids_py)."""
    return _c.pack_json_u32(text)


def split_json_tokens(body: Any) -> tuple[int, int, bytes] | None:
    """(start, stop, packed ids) of the top-level "tokens" array of a JSON object with plain keys,
    or None (twin: consumers.score_body.split_json_tokens_py); lets the GIL go for a long body."""
    return _c.split_json_tokens(body)


def all_int64(hashes: list, prev: int | None) -> bool:
    """Every hash (and `prev` unless None) an exact int in int64 range."""
    return _c.all_int64(hashes, prev)


def chain_list(token_ids: list, page_size: int, prior: bytes | None, ints: bool = False) -> bytes | None:
    """Digests of the whole pages of a token list, packed and hashed in one pass (ints: their published
    int64s, native); None on a bad id."""
    return _c.chain_list(token_ids, page_size, prior, True, ints)


def chain_pages(pages: Any, prior: bytes | None) -> list[bytes]:
    """Raw digests of a page chain (the C twin of kvevents._chain.chain_digests)."""
    return _c.chain_pages(pages, prior)


def chain_packed(data: bytes, page_size: int, prior: bytes | None, ints: bool = False) -> bytes:
    """Concatenated digests of the chain over packed tokens cut into pages (last may be partial), or
    (ints) their published int64s, native."""
    return _c.chain_packed(data, page_size, prior, ints)


def digests_int64(packed: bytes) -> bytes:
    """Native int64 bytes of the published integers of concatenated 32-byte digests."""
    return _c.digests_int64(packed)


_SLOTS: dict[type, tuple | None] = {}
_WALK_EXTRA: dict[tuple[type, type], tuple] = {}  # (PrefixMatch, WorkerMatch) -> walk's trailing args


def _slots_of(cls: type, want: tuple[str, ...] = ("pages", "score", "pages_by_medium")) -> tuple | None:
    """The slot descriptors (fields `want`, in order) of a plain slotted dataclass, so the C walk
    fills results without running __init__; None (C calls the class) for anything else."""
    if cls not in _SLOTS:
        names = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ()
        plain = names == want and not hasattr(cls, "__post_init__")
        descs = tuple(cls.__dict__.get(n) for n in names)
        _SLOTS[cls] = descs if plain and all(type(d) is types.MemberDescriptorType for d in descs) else None
    return _SLOTS[cls]


def walk(hashes: Any, plan: list, layout: list, media: list, weights: list, prefix_cls: type, worker_cls: type) -> Any:
    """The index walk over table views (see kvevents.consumers.lookup.walk_plan); NotImplemented when the
    weights are not all floats (the Python twin then runs, keeping its result types)."""
    extra = _walk_extra(prefix_cls, worker_cls)
    return _c.walk(hashes, plan, _c.pack_layout(layout), media, weights, prefix_cls, worker_cls, *extra)


def bind_walk(plan: list, layout: list, media: list, weights: list, prefix_cls: type, worker_cls: type) -> Any:
    """`walk` with everything but the request's hashes bound: a callable of the hashes alone, for
    callers that repeat a lookup shape (the arguments are parsed, the views opened and the layout
    flattened once, at bind: ValueError then for bad ones)."""
    extra = _walk_extra(prefix_cls, worker_cls)
    return _c.BoundWalk((plan, _c.pack_layout(layout), media, weights, prefix_cls, worker_cls, *extra))


def bind_walk_columns(plan: list, layout: list, media: list, weights: list) -> Any:
    """`bind_walk` whose callable returns the matched workers as columns: bytes of three native arrays
    (worker index int64, prefix pages int64, score float64), in PrefixMatch.workers' order."""
    return _c.BoundWalk((plan, _c.pack_layout(layout), media, weights, None, None, builtins.sum, None, None))


def _walk_extra(prefix_cls: type, worker_cls: type) -> tuple:
    extra = _WALK_EXTRA.get((prefix_cls, worker_cls))
    if extra is None:
        extra = _WALK_EXTRA[prefix_cls, worker_cls] = (
            builtins.sum,
            _slots_of(worker_cls),
            _slots_of(prefix_cls, ("pages", "workers")),
        )
    return extra


def set_bits_each(
    view: tuple, hashes: list[int], col: int, bit: int, prev: int | None
) -> tuple[list[int], int, int, int, int] | None:
    """The store loop over a table view: (duplicates, live added, used added, stop, need): stop -1
    when every hash is stored, else the index of the first hash whose record did not fit the pool
    (grow it by `need` words and go on from there); None to fall back (a hash is the vacant key)."""
    return _c.set_bits_each(view, hashes, col, bit, prev)


def store_event(
    view: tuple,
    hashes: list[int],
    col: int,
    bit: int,
    prev: int | None,
    parent_views: list[tuple],
    parent_cols: list[int],
) -> tuple[list[int], int, int, int, int, bool] | None:
    """One BlockStored in one call: (set_bits_each's answer, and whether `prev` was held in
    `parent_views` before it), or None (a hash or `prev` not an exact int64, or the vacant key:
    nothing written, the general path runs)."""
    return _c.store_event(view, hashes, col, bit, prev, parent_views, parent_cols)


def remove_each(
    views: list[tuple],
    vids: list[int],
    extra: dict,
    mi: int,
    col: int,
    wi: int,
    hashes: list[int],
    prefer: int | None,
    exact: bool,
) -> tuple[int, int, list[int], list[int], int, int, int]:
    """The remove loop over table views (view ids `vids`): (unknown, ambiguous, copies removed per
    view, rows deleted per view, stop, stop view, need): stop -1 when every hash was done, else the
    first hash not done, whose shared record's copy needs `need` more words in view `stop view`'s pool."""
    return _c.remove_each(views, vids, extra, mi, col, wi, hashes, prefer, exact)


def clear_worker(view: tuple, cols: list[int], bit: int) -> tuple[int, int]:
    """Clear `bit` of each of `cols` in every slot of a table view: (bits cleared, rows deleted)."""
    return _c.clear_worker(view, cols, bit)


def holds_bit(views: list[tuple], h: int, cols: list[int], bit: int) -> bool:
    """Does any view hold key `h` with `bit` set in one of `cols`?"""
    return _c.holds_bit(views, h, cols, bit)


def score_rows(
    template: dict[str, Any],
    sources: list[Any],
    dp_ranks: list[Any],
    worker: Any,
    at: Any,
    cost: Any,
    matched_pages: Any,
    matched_score: Any,
    predicted: Any,
    page_size: int,
    names: tuple[str, ...],
    extra: tuple[list[Any], ...],
) -> list[dict[str, Any]]:
    """The /score answer's worker dicts from the ranking's columns (twin: consumers/service/answer_rows.py)."""
    return _c.score_rows(
        template, sources, dp_ranks, worker, at, cost, matched_pages, matched_score, predicted, page_size, names, extra
    )


def cost_order(cost: Any, worker: Any, salt: int) -> bytes:
    """Native intp bytes: the rows' order by (cost, the worker's tie order under `salt`) (twin: consumers/cost.py)."""
    return _c.cost_order(cost, worker, salt)


def prefix_rank(have: Any, worker: Any, request_pages: float, scale: float, salt: int) -> bytes:
    """The ranking without loads: workers, costs and input positions, best first (twin: consumers/cost.py)."""
    return _c.prefix_rank(have, worker, request_pages, scale, salt)
