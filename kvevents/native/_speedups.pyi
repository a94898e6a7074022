"""Types of the compiled extension kvevents.native._speedups (C in kvevents/native/*.c).

Every function it exports, positional-only as in C. Malformed arguments raise ValueError (TypeError
for chain_pages' pages). Callers go through kvevents.native, never this module directly.
"""

from collections.abc import Callable, Sequence
from types import NotImplementedType
from typing import Any, Literal, TypeAlias, TypeVar

from typing_extensions import Buffer

_P = TypeVar("_P")

#: HashTable.cview(): keys int64, state uint8, parent int64, rows uint64, overflow uint8, nshift,
#: vacant key, spill {key: slot}, pool words uint64, pool meta int64 (field names: layout()["CVIEW"])
_CView: TypeAlias = tuple[Buffer, Buffer, Buffer, Buffer, Buffer, int, int, dict[int, int], Buffer, Buffer]
_SlotDescriptors: TypeAlias = tuple[Any, ...]  # member descriptors of a slotted dataclass, in field order

# the contract's page chain (_chain.c)

def chain_pages(pages: Sequence[Buffer], prior: bytes | None, /) -> list[bytes]: ...
def chain_packed(data: Buffer, page_size: int, prior: bytes | None, ints: bool = False, /) -> bytes: ...
def digests_int64(digests: Buffer, /) -> bytes: ...
def pack_u32(token_ids: list[int], /) -> bytes | None: ...
def pack_json_u32(text: bytes | bytearray | memoryview, /) -> bytes | None: ...
def split_json_tokens(body: Buffer, /) -> tuple[int, int, bytes] | None: ...
def chain_list(
    token_ids: list[int], page_size: int, prior: bytes | None, whole: bool, ints: bool = False, /
) -> bytes | None: ...
def sha_impl() -> Literal["sha-ni", "portable"]: ...
def select_sha(allow_shani: object, /) -> Literal["sha-ni", "portable"]: ...

# the index walk and apply (_table.c, _walk.c, _walk_emit.c, _walk_bound.c, _apply.c)

def layout() -> dict[str, int | tuple[str, ...]]: ...
def pack_layout(layout: list[Any], /) -> bytes: ...
def walk(
    hashes: Buffer,
    plan: list[tuple[_CView, Buffer | None]],
    layout: bytes,
    media: list[str | None],
    weights: list[float],
    prefix_cls: type[_P],
    worker_cls: type[Any],
    sum_fn: Callable[[list[float]], float],
    wm_fields: _SlotDescriptors | None = None,
    pm_fields: _SlotDescriptors | None = None,
    /,
) -> _P | NotImplementedType: ...

class BoundWalk:
    """`walk` prepared once for its 9 bound arguments (plan .. pm_fields), called with the hashes."""

    args: tuple[Any, ...]
    def __init__(self, bound: tuple[Any, ...], /) -> None: ...
    def __call__(self, hashes: Buffer, /) -> Any: ...
    def packed(self, ids: Buffer, page_size: int, prior: bytes | None, /) -> tuple[bytes, Any]: ...

def all_int64(hashes: list[int], prev: int | None, /) -> bool: ...
def set_bits_each(
    view: _CView, hashes: list[int], col: int, bit: int, prev: int | None, /
) -> tuple[list[int], int, int, int, int] | None: ...
def remove_each(
    views: list[_CView],
    vids: list[int],
    extra: dict[Any, int],
    mi: int,
    col: int,
    wi: int,
    hashes: list[int],
    prefer: int | None,
    exact: bool,
    /,
) -> tuple[int, int, list[int], list[int], int, int, int]: ...
def store_event(
    view: _CView,
    hashes: list[int],
    col: int,
    bit: int,
    prev: int | None,
    parent_views: list[_CView],
    parent_cols: list[int],
    /,
) -> tuple[list[int], int, int, int, int, bool] | None: ...
def clear_worker(view: _CView, cols: list[int], bit: int, /) -> tuple[int, int]: ...
def holds_bit(views: list[_CView], h: int, cols: list[int], bit: int, /) -> bool: ...
def score_rows(
    template: dict[str, Any],
    sources: list[Any],
    dp_ranks: list[Any],
    worker: Buffer,
    at: Buffer,
    cost: Buffer,
    matched_pages: Buffer,
    matched_score: Buffer,
    predicted: Buffer | None,
    page_size: int,
    names: tuple[str, ...],
    extra: tuple[list[Any], ...],
    /,
) -> list[dict[str, Any]]: ...
def cost_order(cost: Buffer, worker: Buffer, salt: int, /) -> bytes: ...
def prefix_rank(have: Buffer, worker: Buffer, request_pages: float, scale: float, salt: int, /) -> bytes: ...
