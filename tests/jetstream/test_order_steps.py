"""StreamOrder (kvevents/jetstream/order.py, the JetStream feed's ordering rules) step by step, as
tables: each row is one input in stream order (a stored live batch, a complete snapshot, time
passing on a fake clock) and what `take()` must return right after it. No NATS, no sleeps; only
the public API (`live`, `snapshot`, `tick`, `take`, `counters`, `start_anywhere`).

Row notation. Inputs: `live S` (engine seq S; `e=E` its epoch, default 7, `e=none` for none;
`rank=R`; `bad` instead of `live` for an undecodable payload), `snap S` (a complete snapshot
covering up to seq S, two batches; `e=E`), `wait T` (the clock moves T s, then `tick()`).
Outputs: `live S` / `snapshot S` deliveries, `reset REASON`; ` rR` is appended for dp rank R > 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from kvevents.feed import Delivery, Reset
from kvevents.jetstream.order import LiveMsg, Snapshot, StreamOrder
from tests.helpers.clock import FakeClock
from tests.helpers.payloads import one_store

Row = tuple[str, list[str]]


@dataclass
class Case:
    rows: list[Row]
    options: dict[str, Any] = field(default_factory=dict)
    start_anywhere: bool = False  # reading from a time: a stream may start at the first seq seen
    counters: dict[str, int] = field(default_factory=dict)  # these counters at the end, exactly


CASES: dict[str, Case] = {
    "in order from seq 0; duplicates (a second bridge, a redelivery) dropped": Case(
        [("live 0", ["live 0"]), ("live 1", ["live 1"]), ("live 1", []), ("live 0", []), ("live 2", ["live 2"])],
        counters={"duplicates": 2, "clean_starts": 1, "resets": 0},
    ),
    "stored out of order within the wait: reordered, no reset": Case(
        [("live 0", ["live 0"]), ("live 2", []), ("wait 0.5", []), ("live 1", ["live 1", "live 2"])],
        counters={"gaps": 0, "resets": 0},
    ),
    "a gap that lasts is a Reset(gap); the next snapshot resyncs": Case(
        [
            ("live 0", ["live 0"]),
            ("live 5", []),
            ("wait 1.5", ["reset gap"]),
            ("live 6", []),
            ("snap 4", ["snapshot 4", "snapshot 4", "live 5", "live 6"]),
        ],
        counters={"gaps": 1, "resets": 1, "snapshots_applied": 1},
    ),
    "first contact: a snapshot, then the batches after it": Case(
        [
            ("live 5", []),
            ("snap 3", []),  # 4 is not stored yet: kept until it is
            ("live 4", ["snapshot 3", "snapshot 3", "live 4", "live 5"]),
            ("live 6", ["live 6"]),
        ],
        counters={"snapshots_unusable": 1, "snapshots_applied": 1, "losses": 0},
    ),
    "a newer snapshot that fits replaces one that does not": Case(
        [("live 9", []), ("snap 3", []), ("snap 8", ["snapshot 8", "snapshot 8", "live 9"]), ("live 10", ["live 10"])],
        counters={"snapshots_unusable": 1, "snapshots_applied": 1},
    ),
    "a snapshot behind the position that disagrees with what was delivered repairs it (anti-entropy)": Case(
        [
            ("live 0", ["live 0"]),
            ("live 1", ["live 1"]),
            ("snap 0", ["reset gap", "snapshot 0", "snapshot 0"]),  # its blocks are not the ones delivered
        ],
        counters={"snapshots_behind": 1, "anti_entropy_repairs": 1, "snapshots_applied": 1},
    ),
    "a snapshot ahead of the position is kept for a gap": Case(
        [
            ("live 0", ["live 0"]),
            ("live 1", ["live 1"]),
            ("snap 6", []),
            ("live 7", []),  # 2..6 never come
            ("wait 1.5", ["reset gap", "snapshot 6", "snapshot 6", "live 7"]),
        ],
        counters={"snapshots_applied": 1},
    ),
    "a new epoch is adopted once the old one is quiet; the old epoch's late batches are stale": Case(
        [
            ("live 0", ["live 0"]),
            ("live 1", ["live 1"]),
            ("live 3 e=8", []),  # a candidate: the old epoch may still be talking (a forgery would be)
            ("wait 1.5", ["reset restart"]),
            ("live 2", []),
            ("snap 2 e=8", ["snapshot 2", "snapshot 2", "live 3"]),
        ],
        counters={"restarts": 1, "stale_epoch": 1, "epoch_candidates": 1},
    ),
    "a new epoch's snapshot first is a restart too, once the old epoch is quiet": Case(
        [
            ("live 0", ["live 0"]),
            ("snap 5 e=8", []),
            ("wait 1.5", ["reset restart", "snapshot 5", "snapshot 5"]),
            ("live 6 e=8", ["live 6"]),
        ],
        counters={"restarts": 1, "resets": 1},
    ),
    "a new epoch from seq 0 needs no snapshot": Case(
        [("live 0", ["live 0"]), ("live 1", ["live 1"]), ("live 0 e=9", []), ("wait 1.5", ["reset restart", "live 0"])],
        counters={"restarts": 1},
    ),
    "without epochs, seq 0 again after more is a restart": Case(
        [
            ("live 0 e=none", ["live 0"]),
            ("live 1 e=none", ["live 1"]),
            ("live 2 e=none", ["live 2"]),
            ("live 0 e=none", ["reset restart", "live 0"]),
        ],
        counters={"restarts": 1, "clean_starts": 2},
    ),
    "no snapshot within resync_timeout_s: a clean start, counted as a loss": Case(
        [("live 5", []), ("wait 5", []), ("wait 6", ["live 5"])],
        counters={"losses": 1},
    ),
    "reading from a time starts at the first seq seen, no loss": Case(
        [("live 5", ["live 5"]), ("live 6", ["live 6"])],
        start_anywhere=True,
        counters={"losses": 0},
    ),
    "an undecodable batch is counted and its seq skipped": Case(
        [("live 0", ["live 0"]), ("bad 1", []), ("live 2", ["live 2"])],
        counters={"bad_payloads": 1, "resets": 0},
    ),
    "dp ranks are ordered apart: a gap on one resets only that one": Case(
        [
            ("live 0", ["live 0"]),
            ("live 0 rank=1", ["live 0 r1"]),
            ("live 3 rank=1", []),
            ("live 1", ["live 1"]),
            ("wait 1.1", ["reset gap r1"]),
            ("live 2", ["live 2"]),
        ],
        counters={"gaps": 1, "resets": 1},
    ),
    "past max_pending the held batches are dropped and counted": Case(
        [("live 0", ["live 0"]), ("live 2", []), ("live 3", []), ("live 4", [])],
        options={"max_pending": 2},
        counters={"buffer_overflows": 1},
    ),
}


def _epoch(opts: dict[str, str]) -> int | None:
    e = opts.get("e", "7")
    return None if e == "none" else int(e)


def _step(o: StreamOrder, clock: FakeClock, row: str) -> None:
    word, n, *rest = row.split()
    if word == "wait":
        clock.advance(float(n))
        o.tick()
        return
    seq, opts = int(n), dict(x.split("=") for x in rest)
    rank = int(opts.get("rank", 0))
    if word == "snap":
        o.snapshot(Snapshot("w0", rank, seq, _epoch(opts), [one_store(1), one_store(2)], start=1))
    else:
        payload = b"\xc1 not msgpack" if word == "bad" else one_store(100 + seq)
        o.live(LiveMsg("w0", rank, seq, _epoch(opts), payload))


def _outputs(items: list) -> list[str]:
    out = []
    for d in items:
        assert isinstance(d, (Delivery, Reset)) and d.source == "w0"
        text = f"{d.kind} {d.seq}" if isinstance(d, Delivery) else f"reset {d.reason}"
        out.append(text + (f" r{d.dp_rank}" if d.dp_rank else ""))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_stream_order_steps(name: str) -> None:
    case = CASES[name]
    clock = FakeClock()
    o = StreamOrder(reorder_wait_s=1.0, resync_timeout_s=10.0, clock=clock, **case.options)
    o.start_anywhere = case.start_anywhere
    for i, (row, outputs) in enumerate(case.rows):
        _step(o, clock, row)
        assert _outputs(o.take()) == outputs, f"row {i}: {row!r}"
    for key, want in case.counters.items():
        assert o.counters[key] == want, (key, o.counters[key], want)
