"""The Sequencer (kvevents/zeromq/sequencer.py) step by step, as tables: each row is one input
(a live message, a DEALER reply, time passing on a fake clock, a reconnect) and what `take()`
must return right after it (deliveries and resets, socket commands). Only the public API is used
(`on_live`, `on_reply`, `on_connect`, `tick`, `take`, `status`, `counters`), and frames are built
from the wire's constants, as a publisher sends them (the contract, "Transport in one page").

Row notation. Inputs: `live S` (a one-page batch at seq S; `h=H` another payload, `rank=R` its dp
rank), `heartbeat S` (no events), `garbage S` (undecodable payload), `short S` (2 frames),
`describe E` (a KVE/DESCRIBE answer with epoch E), `replay S`, `end` (the replay end marker),
`snap H` (a snapshot batch), `snapend S` (the snapshot end marker, covering up to seq S),
`wait T` (the clock moves T s, then `tick()`), `connect` (the SUB connected), `stale?` (checks
`status()` says stale). Outputs: `live S` / `replay S` / `snapshot S` deliveries, `reset REASON`.
Commands: `describe`, `snapshot`, `replay S` (a request sent), `drop` (the DEALER closed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from kvevents.feed import Delivery, Reset
from kvevents.zeromq.sequencer import DropDealer, Send, Sequencer
from kvevents.zeromq.source import Source
from kvevents.zeromq.wire import DESCRIBE_REQUEST, END_SEQ, SNAPSHOT_REQUEST, SNAPSHOT_SEQ, pack_seq
from tests.helpers.clock import FakeClock
from tests.helpers.payloads import batch, one_store

Row = tuple[str, list[str], list[str]]  # input, outputs, commands


@dataclass
class Case:
    rows: list[Row]
    options: dict[str, Any] = field(default_factory=dict)
    replay: bool = True  # the source has a replay endpoint
    counters: dict[str, int] = field(default_factory=dict)  # counters at the end (these, exactly)
    next_seq: int | None = None  # status()["w"].next_seq at the end


CASES: dict[str, Case] = {
    "first contact replays the kept history (start=oldest)": Case(
        [
            ("live 3", [], ["describe"]),
            ("describe 7", [], ["replay 0"]),
            ("replay 0", ["replay 0"], []),
            ("replay 1", ["replay 1"], []),
            ("replay 2", ["replay 2"], []),
            ("replay 3", ["replay 3"], []),
            ("end", [], []),  # live 3, held meanwhile, came again by replay: a duplicate
            ("live 4", ["live 4"], []),
        ],
        counters={"replayed": 4, "live": 1, "duplicates": 1, "losses": 0},
        next_seq=5,
    ),
    "start=now takes the first live batch, no loss counted": Case(
        [("live 3", [], ["describe"]), ("describe 7", ["live 3"], []), ("live 4", ["live 4"], [])],
        options={"start": "now"},
        counters={"live": 2, "losses": 0, "replays_requested": 0},
        next_seq=5,
    ),
    "start=snapshot: Reset(first), the snapshot's batches at its seq, then the batches after it": Case(
        [
            ("live 3", [], ["describe"]),
            ("describe 7", ["reset first"], ["snapshot"]),
            ("snap 50", [], []),
            ("snap 51", [], []),
            ("snapend 3", ["snapshot 3", "snapshot 3"], []),
            ("live 4", ["live 4"], []),
        ],
        options={"start": "snapshot"},
        counters={"snapshot_batches": 2, "snapshots_applied": 1, "resets": 1, "duplicates": 1},
        next_seq=5,
    ),
    "without a replay endpoint: a late join and a gap are counted losses": Case(
        [
            ("live 3", ["live 3"], []),
            ("live 4", ["live 4"], []),
            ("live 6", ["reset gap", "live 6"], []),
        ],
        replay=False,
        counters={"losses": 2, "gaps": 1, "unrecoverable_gaps": 1, "describes_requested": 0},
        next_seq=7,
    ),
    "duplicates are dropped; a heartbeat takes its seq": Case(
        [
            ("live 0", [], ["describe"]),
            ("describe 7", ["live 0"], []),
            ("live 1", ["live 1"], []),
            ("live 1", [], []),
            ("heartbeat 2", ["live 2"], []),
            ("live 2", [], []),
        ],
        counters={"duplicates": 2, "heartbeats": 1, "live": 3},
        next_seq=3,
    ),
    "bad messages are counted and skipped, the stream goes on": Case(
        [
            ("live 0", [], ["describe"]),
            ("describe 7", ["live 0"], []),
            ("garbage 1", [], []),
            ("short 1", [], []),
            ("live 1", ["live 1"], []),
        ],
        counters={"bad_payloads": 1, "bad_frames": 1, "live": 2},
        next_seq=2,
    ),
    "a replay that starts past the gap is a Reset(gap) and a snapshot request": Case(
        [
            ("live 0", [], ["describe"]),
            ("describe 7", ["live 0"], []),
            ("live 5", [], ["describe"]),  # a gap replay confirms the epoch first
            ("describe 7", [], ["replay 1"]),
            ("replay 3", [], []),  # the ring no longer holds 1 and 2
            ("replay 4", [], []),
            ("replay 5", [], []),
            ("end", ["reset gap"], ["snapshot"]),
            ("live 6", [], []),  # held until the snapshot
            ("snap 60", [], []),
            ("snapend 6", ["snapshot 6"], []),
            ("live 7", ["live 7"], []),
        ],
        counters={"gaps": 1, "unrecoverable_gaps": 1, "resets": 1, "snapshots_applied": 1},
        next_seq=8,
    ),
    "dp ranks past max_ranks are counted and dropped": Case(
        [
            ("live 0", [], ["describe"]),
            ("describe 7", ["live 0"], []),
            ("live 0 rank=1", [], ["describe"]),
            ("live 0 rank=2", [], []),
        ],
        options={"max_ranks": 2},
        counters={"dropped_ranks": 1},
        next_seq=1,
    ),
    "a full buffer is cleared and the replay covers it again": Case(
        [
            ("live 0", [], ["describe"]),
            ("describe 7", ["live 0"], []),
            ("live 3", [], ["describe"]),
            ("live 4", [], []),
            ("live 5", [], []),
            ("live 6", [], []),  # the third held batch: the buffer (2) starts over
            ("describe 7", [], ["replay 1"]),
            ("replay 1", ["replay 1"], []),
            ("replay 2", ["replay 2"], []),
            ("replay 3", ["replay 3"], []),
            ("end", [], ["describe"]),  # 4 and 5 were dropped with the buffer: a new gap repair
            ("describe 7", [], ["replay 4"]),
            ("replay 4", ["replay 4"], []),
            ("replay 5", ["replay 5"], []),
            ("replay 6", ["replay 6"], []),
            ("end", [], []),
        ],
        options={"max_buffer": 2},
        counters={"buffer_overflows": 1, "gaps": 2, "replayed": 6},
        next_seq=7,
    ),
    "silence makes a source stale; the next batch confirms the epoch first": Case(
        [
            ("live 0", [], ["describe"]),
            ("describe 7", ["live 0"], []),
            ("wait 3", [], []),
            ("wait 3", [], []),
            ("stale?", [], []),
            ("live 1", [], ["describe"]),
            ("describe 7", ["live 1"], []),
            ("live 2", ["live 2"], []),
        ],
        options={"stale_after_s": 5.0},
        counters={"stale_sources": 1, "stale_returns": 1},
        next_seq=3,
    ),
    "after a reconnect a new epoch is a restart resynced by snapshot": Case(
        [
            ("live 0", [], ["describe"]),
            ("describe 7", ["live 0"], []),
            ("live 1", ["live 1"], []),
            ("connect", [], []),
            ("connect", [], []),  # the first connection is not a reconnect; the second is
            ("live 2", [], ["describe"]),
            ("describe 8", ["reset restart"], ["snapshot"]),
            ("snap 9", [], []),
            ("snapend 2", ["snapshot 2"], []),
            ("live 3", ["live 3"], []),
        ],
        counters={"reconnects": 1, "restarts": 1, "snapshots_applied": 1},
        next_seq=4,
    ),
    "an unanswered DESCRIBE times out once, then seqs alone decide": Case(
        [
            ("live 0", [], ["describe"]),
            ("wait 0.5", [], []),
            ("wait 0.6", ["live 0"], ["drop"]),
            ("live 1", ["live 1"], []),
        ],
        counters={"describe_timeouts": 1, "live": 2},
        next_seq=2,
    ),
    "a replay that never ends times out, is retried, then given up for a snapshot": Case(
        [
            ("live 0", [], ["describe"]),
            ("describe 7", ["live 0"], []),
            ("live 2", [], ["describe"]),
            ("describe 7", [], ["replay 1"]),
            ("wait 1.1", [], ["drop"]),  # no reply within request_timeout_s
            ("wait 0.3", [], ["describe"]),  # after the backoff: the repair again, DESCRIBE first
            ("describe 7", [], ["replay 1"]),
            ("wait 1.1", ["reset gap"], ["drop"]),  # max_attempts reached: unrecoverable
        ],
        options={"request_timeout_s": 1.0, "max_attempts": 2},
        counters={"replay_timeouts": 2, "unrecoverable_gaps": 1, "resets": 1},
        next_seq=None,
    ),
}


def _frames(row: str) -> tuple[str, list[bytes]]:
    """The message a row stands for: ("live" | "reply", frames after the ROUTER identity)."""
    word, *rest = row.split()
    n = int(rest[0]) if rest and rest[0].isdigit() else 0
    opts = dict(x.split("=") for x in rest[1:])
    live = {
        "live": lambda: one_store(int(opts.get("h", n)), rank=int(opts.get("rank", 0))),
        "heartbeat": lambda: batch([]),
        "garbage": lambda: b"\xc1 not msgpack",
    }
    if word in live:
        return "live", [b"", pack_seq(n), live[word]()]
    if word == "short":
        return "live", [b"", pack_seq(n)]
    reply = {
        "describe": lambda: [b"", msgspec.msgpack.encode({"epoch": n})],
        "replay": lambda: [b"", b"", pack_seq(n), one_store(n)],
        "end": lambda: [b"", b"", END_SEQ, b""],
        "snap": lambda: [b"", b"", SNAPSHOT_SEQ, one_store(n)],
        "snapend": lambda: [b"", b"", END_SEQ, pack_seq(n)],
    }
    return "reply", reply[word]()


def _outputs(items: list) -> list[str]:
    return [f"{d.kind} {d.seq}" if isinstance(d, Delivery) else f"reset {d.reason}" for d in items]


def _commands(cmds: list) -> list[str]:
    named = {DESCRIBE_REQUEST: "describe", SNAPSHOT_REQUEST: "snapshot"}
    out = []
    for c in cmds:
        if isinstance(c, DropDealer):
            out.append("drop")
        else:
            assert isinstance(c, Send) and c.source == "w"
            out.append(named.get(c.body) or f"replay {int.from_bytes(c.body, 'big')}")
    return out


def _step(q: Sequencer, clock: FakeClock, row: str) -> None:
    word = row.split()[0]
    if word == "wait":
        clock.advance(float(row.split()[1]))
        q.tick()
    elif word == "connect":
        q.on_connect("w")
    elif word == "stale?":
        assert q.status()["w"].stale
    else:
        kind, frames = _frames(row)
        (q.on_live if kind == "live" else q.on_reply)("w", frames)


@pytest.mark.parametrize("name", list(CASES))
def test_sequencer_steps(name: str) -> None:
    case = CASES[name]
    clock = FakeClock()
    src = Source("tcp://127.0.0.1:1", "tcp://127.0.0.1:2" if case.replay else None, "w")
    q = Sequencer([src], clock=clock, **case.options)
    for i, (row, outputs, commands) in enumerate(case.rows):
        _step(q, clock, row)
        out, cmds = q.take()
        assert (_outputs(out), _commands(cmds)) == (outputs, commands), f"row {i}: {row!r}"
        assert all(isinstance(o, (Delivery, Reset)) for o in out)
    for key, want in case.counters.items():
        assert q.counters[key] == want, (key, q.counters[key], want)
    assert q.status()["w"].next_seq == case.next_seq


def test_the_tables_cover_every_row_kind() -> None:
    """Each input word of the notation is used by some table (a row kind without a case is dead)."""
    used = {row.split()[0] for case in CASES.values() for row, _, _ in case.rows}
    assert used == {"live", "heartbeat", "garbage", "short", "describe", "replay", "end", "snap", "snapend"} | {
        "wait",
        "connect",
        "stale?",
    }
