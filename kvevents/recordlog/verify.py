"""`log inspect --verify`: check a recorded stream against the contract (schemas/README.md: "Event hashes",
"What the reference cache emits", the consumer rules under "Transport in one page").

Checks, per (source, dp_rank): parents are stored before children; removes only remove live
copies (ref-counted per source/rank/medium/hash); every published hash recomputes from token_ids.
Published integers keep only 8 digest bytes, so to recompute a child we keep the full hex digest
of every block we verified (int64 -> hex); a head block (parent None) must match the unseeded
chain, the event seed of a listed salt, or (when the event carries one) exactly its cache_salt.

Digests are kept only while some source holds a live copy of the block, so memory follows the
live set, not the log length.

Knowledge of a source starts at an AllBlocksCleared (the cache emits one at construction, a
snapshot begins with one). Before that, and after a reset marker, a seq gap or an epoch change,
parent and remove checks for that source are suspended (counted as unchecked), not reported.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kvevents.errors import DecodeError
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from kvevents.hashing import Namespace, event_seed, pack_tokens
from kvevents.recordlog.format import Record
from kvevents.recordlog.reader import Damage, feed_log
from kvevents.recordlog.stats import SeqTracker

__all__ = ["Violation", "VerifyReport", "ContractVerifier", "verify_log", "KEPT_PER_CODE"]


@dataclass(frozen=True)
class Violation:
    """One contract violation, located by record index (and event index inside the batch)."""

    record: int
    source: str
    seq: int | None
    event: int | None
    code: str  # decode | parent-missing | remove-not-live | hash-mismatch | token-count | block-size
    message: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def where(self) -> str:
        """`record 12 event 0 (w0 seq 11)`."""
        at = f"record {self.record}" + (f" event {self.event}" if self.event is not None else "")
        return f"{at} ({self.source} seq {self.seq})"

    def __str__(self) -> str:
        return f"{self.where()}: {self.code}: {self.message}"


#: Violations kept per code (all are counted): a log verified at the wrong page size breaks every
#: event, and its report must not grow with the log.
KEPT_PER_CODE = 100


@dataclass
class VerifyReport:
    """Violations plus what was checked (and what could not be).

    `violations` keeps the first KEPT_PER_CODE of each code, `counts` counts them all. `page_size`
    is the one asked for, or (0 until seen) the first block_size of the stream: `block_sizes`
    counts the BlockStored events of each size."""

    page_size: int
    salts: list[str]
    records: int = 0
    events: int = 0
    blocks_verified: int = 0
    blocks_unverifiable: int = 0
    parents_unchecked: int = 0
    removes_unchecked: int = 0
    heads: Counter = field(default_factory=Counter)  # "unseeded" / "salt:<s>" -> heads matched
    violations: list[Violation] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # code -> violations found
    block_sizes: Counter = field(default_factory=Counter)  # block_size -> BlockStored events
    page_size_given: bool = True  # False: each event is checked at its own block_size

    @property
    def ok(self) -> bool:
        return not self.counts

    @property
    def violation_count(self) -> int:
        return sum(self.counts.values())

    def add(self, v: Violation) -> None:
        """Count a violation; keep it while fewer than KEPT_PER_CODE of its code are kept."""
        self.counts[v.code] += 1
        if self.counts[v.code] <= KEPT_PER_CODE:
            self.violations.append(v)

    def saw_block_size(self, size: Any) -> None:
        if isinstance(size, int) and not isinstance(size, bool):
            self.block_sizes[size] += 1
            if not self.page_size:
                self.page_size = size

    def grouped(self) -> list[tuple[str, int, Violation]]:
        """(code, count, first violation) per code, in the order the codes first occurred."""
        firsts: dict[str, Violation] = {}
        for v in self.violations:
            firsts.setdefault(v.code, v)
        return [(code, self.counts[code], firsts[code]) for code in firsts]

    def as_dict(self) -> dict[str, Any]:
        skip = ("violations", "damage", "heads", "counts", "block_sizes")
        d = {k: v for k, v in self.__dict__.items() if k not in skip}
        d["heads"] = dict(self.heads)
        d["ok"] = self.ok
        d["violation_counts"] = dict(self.counts)
        d["block_sizes"] = {str(k): n for k, n in sorted(self.block_sizes.items())}
        d["violations"] = [v.as_dict() for v in self.violations]
        d["damage"] = [x.as_dict() for x in self.damage]
        return d


class _Src:
    __slots__ = ("known", "copies", "any")

    def __init__(self) -> None:
        self.known = False
        self.copies: Counter = Counter()  # (medium, hash) -> live copies
        self.any: Counter = Counter()  # hash -> live copies on any medium

    def clear(self, known: bool, live: Counter, full: dict[int, bytes]) -> None:
        """Forget every copy (AllBlocksCleared, reset, lost events); digests of blocks no source holds go."""
        for h, n in self.any.items():
            left = live[h] - n
            if left > 0:
                live[h] = left
            else:
                del live[h]
                full.pop(h, None)
        self.known = known
        self.copies.clear()
        self.any.clear()


class ContractVerifier:
    """Feed records in log order with `feed`; read `report` at the end."""

    def __init__(self, page_size: int | None, salts: Iterable[str] = ()) -> None:
        if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
            raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
        self.page_size = page_size  # None: each event's own block_size
        self.salts = [s for s in salts]
        self.report = VerifyReport(page_size or 0, list(self.salts), page_size_given=page_size is not None)
        self._heads: list[tuple[str, bytes | None]] = [("unseeded", None)]
        for s in self.salts:
            seed = event_seed(Namespace(cache_salt=s))
            if seed is not None:
                self._heads.append((f"salt:{s}", bytes.fromhex(seed)))
        self._full: dict[int, bytes] = {}  # published int64 -> full digest of a verified, live block
        self._live: Counter = Counter()  # published int64 -> live copies over all sources (bounds _full)
        self._src: dict[tuple[str, Any], _Src] = {}
        self._seqs = SeqTracker()

    def _state(self, source: str, rank: Any) -> _Src:
        st = self._src.get((source, rank))
        if st is None:
            st = self._src[(source, rank)] = _Src()
        return st

    def _violate(self, rec: Record, ev: int | None, code: str, msg: str) -> None:
        self.report.add(Violation(rec.index, rec.source, rec.seq, ev, code, msg))

    def feed(self, rec: Record) -> None:
        rep = self.report
        rep.records += 1
        if rec.kind == "reset":
            self._seqs.reset(rec.source, rec.dp_rank)
            for (s, r), st in self._src.items():
                if s == rec.source and (rec.dp_rank is None or r == rec.dp_rank):
                    st.clear(False, self._live, self._full)
            return
        try:
            batch = decode_batch(rec.payload)
        except DecodeError as exc:
            self._violate(rec, None, "decode", str(exc))
            return
        rank = batch.data_parallel_rank if batch.data_parallel_rank is not None else rec.dp_rank
        st = self._state(rec.source, rank)
        epoch = batch.epoch if batch.epoch is not None else rec.epoch
        if rec.kind == "snapshot" and rec.seq is not None:
            self._seqs.resume(rec.source, rank, rec.seq, epoch)
        elif rec.kind in ("live", "replay") and rec.seq is not None:
            if self._seqs.observe(rec.source, rank, rec.seq, epoch) is not None:
                st.clear(False, self._live, self._full)  # events lost or publisher restarted: state unknown
        for i, ev in enumerate(batch.events):
            rep.events += 1
            if isinstance(ev, BlockStored):
                self._stored(rec, i, ev, st)
            elif isinstance(ev, BlockRemoved):
                self._removed(rec, i, ev, st)
            elif isinstance(ev, AllBlocksCleared):
                st.clear(True, self._live, self._full)

    def _removed(self, rec: Record, i: int, ev: BlockRemoved, st: _Src) -> None:
        for h in ev.block_hashes:
            key = (ev.medium, h)
            n = st.copies.get(key, 0)
            if n > 0:
                st.copies[key] = n - 1
                st.any[h] -= 1
                left = self._live[h] - 1
                if left > 0:
                    self._live[h] = left
                else:
                    del self._live[h]
                    self._full.pop(h, None)  # a later child of it cannot be valid anyway
            elif st.known:
                self._violate(
                    rec,
                    i,
                    "remove-not-live",
                    f"BlockRemoved of {h} on {ev.medium} but no live copy of it is stored there",
                )
            else:
                self.report.removes_unchecked += 1

    def _stored(self, rec: Record, i: int, ev: BlockStored, st: _Src) -> None:
        rep = self.report
        hashes = ev.block_hashes
        parent = ev.parent_block_hash
        if parent is not None:
            if st.any.get(parent, 0) <= 0:
                if st.known:
                    self._violate(
                        rec,
                        i,
                        "parent-missing",
                        f"parent {parent} of block {hashes[0] if hashes else '?'} has no live copy stored before it",
                    )
                else:
                    rep.parents_unchecked += 1
        live = self._live
        for h in hashes:
            st.copies[(ev.medium, h)] += 1
            st.any[h] += 1
            live[h] += 1
        self._check_hashes(rec, i, ev)

    def _page_size(self, rec: Record, i: int, ev: BlockStored) -> int | None:
        """The page size to check `ev` at: --page-size, else its own block_size (None: not one)."""
        bs = ev.block_size
        self.report.saw_block_size(bs)
        if self.page_size is not None:
            if bs != self.page_size:
                self._violate(rec, i, "block-size", f"block_size {bs} but --page-size is {self.page_size}")
            return self.page_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            self._violate(rec, i, "block-size", f"block_size {bs!r} is not a page size (give --page-size)")
            return None
        return bs

    def _check_hashes(self, rec: Record, i: int, ev: BlockStored) -> None:
        """Recompute every published hash of `ev` from its token_ids, chained from its parent or a head."""
        rep = self.report
        hashes = ev.block_hashes
        if not hashes:
            return
        pages = self._token_pages(rec, i, ev)
        if pages is None:
            return
        data, step = pages
        if ev.parent_block_hash is None:
            head = self._head(rec, i, ev, data[:step])
            if head is None:
                return
            chosen, prior = head
            rep.heads[chosen] += 1
        else:
            prior = self._full.get(ev.parent_block_hash)
            if prior is None:
                rep.blocks_unverifiable += len(hashes)
                return
        self._chain(rec, i, ev, data, step, prior)

    def _token_pages(self, rec: Record, i: int, ev: BlockStored) -> tuple[bytes, int] | None:
        """(packed token ids, bytes per page) when they fit the blocks; else None, the blocks unverifiable."""
        rep = self.report
        hashes = ev.block_hashes
        ps = self._page_size(rec, i, ev)
        if ps is None:
            rep.blocks_unverifiable += len(hashes)
            return None
        try:
            data = pack_tokens(ev.token_ids)
        except ValueError as exc:
            self._violate(rec, i, "token-count", str(exc))
            rep.blocks_unverifiable += len(hashes)
            return None
        step = ps * 4
        if len(data) != step * len(hashes):
            self._violate(
                rec,
                i,
                "token-count",
                f"{len(ev.token_ids)} token ids for {len(hashes)} blocks of page size {ps} "
                f"(expected {len(hashes) * ps})",
            )
            rep.blocks_unverifiable += len(hashes)
            return None
        return data, step

    def _head(self, rec: Record, i: int, ev: BlockStored, first: bytes) -> tuple[str, bytes | None] | None:
        """The allowed chain head (name, seed) the head block's first page matches; None: a violation."""
        sha = hashlib.sha256
        hashes = ev.block_hashes
        if ev.cache_salt is not None:
            seed = event_seed(Namespace(cache_salt=ev.cache_salt))
            heads = [(f"salt:{ev.cache_salt}", bytes.fromhex(seed) if seed else None)]
        else:
            heads = self._heads
        for name, cand in heads:
            h = sha(cand) if cand is not None else sha()
            h.update(first)
            if int.from_bytes(h.digest()[:8], "big", signed=True) == hashes[0]:
                return name, cand
        tried = ", ".join(n for n, _ in heads)
        self._violate(
            rec,
            i,
            "hash-mismatch",
            f"head block {hashes[0]} matches no allowed chain head ({tried}); were the "
            f"published hashes computed with extra_key mixed in (storage hashes), or is "
            f"the page size or salt wrong?",
        )
        self.report.blocks_unverifiable += len(hashes) - 1
        return None

    def _chain(self, rec: Record, i: int, ev: BlockStored, data: bytes, step: int, prior: bytes | None) -> None:
        """Check each block's hash chained from `prior`; keep the verified digests, stop at a mismatch."""
        rep = self.report
        hashes = ev.block_hashes
        sha = hashlib.sha256
        full = self._full
        for k in range(len(hashes)):
            h = sha(prior) if prior is not None else sha()
            h.update(data[k * step : (k + 1) * step])
            digest = h.digest()
            got = int.from_bytes(digest[:8], "big", signed=True)
            if got != hashes[k]:
                self._violate(
                    rec,
                    i,
                    "hash-mismatch",
                    f"block {k} published {hashes[k]} but token_ids give {got} "
                    f"(chained from {'the parent' if k or ev.parent_block_hash is not None else 'the head seed'})",
                )
                rep.blocks_unverifiable += len(hashes) - k - 1
                return
            full[got] = digest
            prior = digest
            rep.blocks_verified += 1


def verify_log(
    path: str | os.PathLike[str],
    page_size: int | None,
    salts: Iterable[str] = (),
    *,
    on_damage: Callable[[Damage], None] | None = None,
) -> VerifyReport:
    """Run the contract checks over a whole log (streaming); page_size None: the events' block_size."""
    v = ContractVerifier(page_size, salts)
    v.report.damage = list(feed_log(path, v.feed, on_damage=on_damage).damage)
    return v.report
