"""The ROUTER extensions judged: KVE/DESCRIBE and KVE/SNAPSHOT (not offered when unanswered).

Functions over a stream checker's public state (`CheckerState`, which `rules.StreamChecker` is);
the observer calls them at the end.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

import msgspec

from kvevents.conformance import shape
from kvevents.conformance.profiles import Profile
from kvevents.conformance.tally import Tally
from kvevents.events import AllBlocksCleared, BlockStored
from kvevents.zeromq.framing import parse_reply
from kvevents.zeromq.wire import SNAPSHOT_SEQ, unpack_seq

__all__ = ["CheckerState", "compare_snapshot", "judge_describe", "judge_snapshot"]


class CheckerState(Protocol):
    """What the probes read and set on the checker that judged the stream."""

    t: dict[str, Tally]
    page_size: int | None
    topic: bytes | None
    rank: Any
    profile: Profile
    last_live: int | None
    allow_epoch: bool
    expected: int | None
    complete: bool
    live: dict[tuple[Any, int], int]
    snapshot_copies: Counter[tuple[Any, int]]


def judge_describe(c: CheckerState, reply: list[bytes] | None) -> None:
    """KVE/DESCRIBE: one map agreeing with the stream; no reply or an empty replay means not offered."""
    t = c.t["describe"]
    if reply is None or shape.is_end_marker(reply):
        t.offered = False
        t.note = "no reply" if reply is None else "answered as a replay (end marker)"
        return
    if len(reply) != 2 or reply[0] != b"":
        return t.fail(f"reply has {len(reply)} frames, want ['', map]")
    try:
        info = msgspec.msgpack.decode(reply[1])
    except msgspec.DecodeError as exc:
        return t.fail(f"reply is not msgpack: {exc}")
    if not isinstance(info, dict):
        return t.fail(f"reply is a {type(info).__name__}, want a map")
    checks = [  # (key, what it should be, who says so, what DESCRIBE says)
        ("page_size", c.page_size, "--page-size says", info.get("page_size")),
        (
            "topic",
            None if c.topic is None else c.topic.decode("utf-8", "replace"),
            "the live messages' topic frame is",
            info.get("topic"),
        ),
        ("dp_rank", c.rank, "the live batches say", info.get("dp_rank")),
        ("hash_scheme", c.profile.hash_scheme, f"the {c.profile.name} profile says", info.get("hash_scheme")),
    ]
    for key, want, source, got in checks:
        if want is not None and got != want:
            t.fail(f"DESCRIBE's {key} is {got!r}, {source} {want!r}")
        else:
            t.ok()
    newest = info.get("newest_seq")
    if c.last_live is not None and (not isinstance(newest, int) or newest < c.last_live):
        t.fail(f"newest_seq {newest!r} is older than seq {c.last_live} already seen live")


def judge_snapshot(c: CheckerState, replies: list[list[bytes]] | None, ended: bool) -> int | None:
    """Shape-check a snapshot reply; returns S (the seq it reflects) to compare at, or None."""
    t = c.t["snapshot"]
    if not replies or (len(replies) == 1 and shape.is_end_marker(replies[0]) and len(replies[0][-1]) != 8):
        t.offered = False
        t.note = "no reply" if not replies else "answered as a replay (end marker only)"
        return None
    if not ended:
        t.fail(f"no end marker after {len(replies)} snapshot batches")
        return None
    end = replies[-1][-1]
    if len(end) != 8:
        t.fail(f"end marker payload of {len(end)} bytes, want the 8-byte seq S")
        return None
    snap: Counter[tuple[Any, int]] = Counter()
    for i, fr in enumerate(replies[:-1]):
        r = parse_reply(fr)
        if r is None or r.seq != SNAPSHOT_SEQ:
            t.fail(f"batch {i}: want ['', topic, ff*7 fe, payload] (or without the topic frame)")
            return None
        problem = shape.batch_problem(r.payload, allow_epoch=c.allow_epoch)
        if problem:
            t.fail(f"batch {i}: {problem}")
            return None
        batch = shape.decode(r.payload)
        assert batch is not None
        if i == 0 and (not batch.events or not isinstance(batch.events[0], AllBlocksCleared)):
            t.fail("the first snapshot batch does not start with AllBlocksCleared")
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                for h in ev.block_hashes:
                    snap[(ev.medium, h)] += 1
    t.ok()
    c.snapshot_copies = snap
    return unpack_seq(end)


def compare_snapshot(c: CheckerState, s: int) -> None:
    """After applying every batch <= S: the snapshot's blocks must equal the live ones."""
    t = c.t["snapshot"]
    if c.expected is None or c.expected <= s or not c.complete:
        t.unknown += 1
        t.note = "live state at S unknown (batches before the window or a gap)"
        return
    snap = c.snapshot_copies
    live = Counter(c.live)
    if snap != live:
        extra, lost = snap - live, live - snap
        return t.fail(
            f"at seq {s}: {sum(extra.values())} copies not live, {sum(lost.values())} live copies missing "
            f"(e.g. {next(iter(extra or lost))})"
        )
    t.ok()
