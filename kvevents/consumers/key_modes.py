"""How a source is keyed: the key modes, their `--key-mode` parsing, and `auto`'s detection.

A source runs in one of three modes (kvevents.consumers.keying applies them): `contract` (published
hash == the contract's event hash), `tokens` (keys derived from each block's token ids), or `auto`:
its batches are held (`AutoHold`, bounded) until a head store of whole pages shows which of the two
the published hashes are (`detect_mode`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

from kvevents.events import AllBlocksCleared, BlockStored, KVEventBatch, rank_of
from kvevents.hashing import Namespace, event_hashes_int64

__all__ = ["KEY_MODES", "AutoHold", "KeyMode", "detect_mode", "parse_key_mode", "parse_key_modes"]

KeyMode = Literal["contract", "tokens", "auto"]
KEY_MODES: tuple[str, ...] = ("contract", "tokens", "auto")


def parse_key_mode(spec: str) -> tuple[str, str]:
    """`NAME=MODE` (MODE one of contract, tokens, auto) -> (name, mode); ValueError otherwise."""
    name, sep, mode = spec.partition("=")
    if not sep or not name.strip() or mode.strip() not in KEY_MODES:
        raise ValueError(f"key mode {spec!r}: expected NAME=MODE with MODE one of {', '.join(KEY_MODES)}")
    return name.strip(), mode.strip()


def parse_key_modes(specs: Sequence[str], names: Sequence[str], default: str = "auto") -> tuple[str, dict[str, str]]:
    """`--key-mode` values: NAME=MODE per publisher, or a bare MODE for every other one ->
    (default mode, {name: mode}); ValueError for an unknown mode or a name that is not a publisher."""
    modes: dict[str, str] = {}
    for spec in specs:
        if "=" not in spec and spec.strip() in KEY_MODES:
            default = spec.strip()
            continue
        name, mode = parse_key_mode(spec)
        if name not in names:
            raise ValueError(f"key mode {spec!r}: no publisher is named {name!r}")
        modes[name] = mode
    return default, modes


def detect_mode(batch: KVEventBatch, page_size: int) -> str | None:
    """contract / tokens from the batch's first head store of whole pages of `page_size` tokens;
    None if the batch has none (inconclusive)."""
    ps = page_size
    for ev in batch.events:
        if type(ev) is not BlockStored or ev.parent_block_hash is not None or not ev.block_hashes:
            continue
        n = len(ev.block_hashes)
        if ev.block_size != ps or len(ev.token_ids) != n * ps:
            continue  # inconclusive: another page size, or a span over skipped blocks
        try:
            want = event_hashes_int64(ev.token_ids, ps, Namespace(cache_salt=ev.cache_salt))
        except ValueError:
            continue  # bad token ids: inconclusive (tokens mode will count the event)
        return "contract" if want == list(ev.block_hashes) else "tokens"
    return None


Held = list[tuple[KVEventBatch, bytes | None]]  # (decoded batch, its raw payload if delivered)


class AutoHold:
    """`auto`'s held batches per source, until `detect_mode` decides (or `max_batches` are held:
    then tokens, which keys any engine exactly, only at more cost). `count()` is the source's Counter
    (called only when there is something to count, so a source with none stays unlisted)."""

    def __init__(self) -> None:
        self._pending: dict[str, Held] = {}

    def offer(
        self,
        source: str,
        b: KVEventBatch | None,
        payload: bytes | None,
        count: Callable[[], Counter[str]],
        page_size: int,
        max_batches: int,
    ) -> tuple[str | None, Held]:
        """(decided mode, the batches to translate now in it, in order) or (None, batches that pass
        as they are: a batch with nothing keyed while none is held; else none, `b` being held)."""
        pending = self._pending.setdefault(source, [])
        if not pending and b is not None and all(type(e) is AllBlocksCleared for e in b.events):
            return None, [(b, payload)]  # nothing keyed in it (heartbeat, reset): applies alike in both modes
        if b is None:
            return None, []  # undecodable (counted by the caller): nothing to hold
        pending.append((b, payload))
        c = count()
        c["auto_held_batches"] += 1
        decided = detect_mode(b, page_size)
        if decided is None and len(pending) >= max_batches:
            decided = "tokens"
            c["auto_undecided"] += 1
        if decided is None:
            return None, []
        c[f"auto_detected_{decided}"] += 1
        del self._pending[source]
        return decided, pending

    def drop(self, source: str, dp_rank: int | None) -> int | None:
        """Forget a source's held batches (of one dp rank, or all): from before a reset, they must
        not be applied after it. Returns how many went, or None if none were held."""
        pending = self._pending.get(source)
        if not pending:
            return None
        kept = [(b, p) for b, p in pending if dp_rank is not None and rank_of(b.data_parallel_rank) != dp_rank]
        if kept:
            self._pending[source] = kept
        else:
            del self._pending[source]
        return len(pending) - len(kept)
