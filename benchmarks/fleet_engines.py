"""A fleet's engines in one process: a real zeromq Publisher per source of a record log.

    python3 benchmarks/fleet_engines.py LOG

Each source's live batches are published again by its own Publisher (loopback, ephemeral ports,
a replay ring holding all of them, snapshots on), then one JSON line on stdout says, per source,
[endpoint, replay endpoint, batches, live blocks]; the engines serve (replay, KVE/SNAPSHOT,
heartbeats) until stdin closes. jetstream_fill's bridge path runs it as a child process so that
the engines' sockets and the bridge's do not share one process's file limit (a thousand engines
and a Subscriber of them in one process pass 20,000 descriptors: every loopback connection
costs both of its ends).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvevents.events import decode_batch  # noqa: E402
from kvevents.recordlog.reader import RecordReader  # noqa: E402

__all__ = ["big_context", "start_engines"]


def big_context(sockets: int) -> Any:
    """A zmq.Context allowing `sockets` sockets and more: ZeroMQ's default cap is 1,023 per context,
    which a thousand engines (PUB + ROUTER each) or a Subscriber of them (SUB, DEALER and their
    monitors: 6 per source) would pass."""
    import zmq

    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, sockets + 256)  # before its first socket: later it is ignored
    return ctx


def start_engines(log_path: str) -> tuple[Any, dict[str, Any], dict[str, int]]:
    """(zmq context, {source: Publisher}, {source: batches published}) for the log's live batches."""
    from kvevents.zeromq.publisher import Publisher

    by_source: dict[str, list[Any]] = {}
    for rec in RecordReader(log_path):
        if rec.kind in ("live", "replay"):
            by_source.setdefault(rec.source, []).append(decode_batch(rec.payload).events)
    ctx = big_context(2 * len(by_source))
    ring = max((len(v) for v in by_source.values()), default=0) + 16
    pubs: dict[str, Any] = {}
    for name, batches in by_source.items():
        pub = pubs[name] = Publisher(
            endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", buffer_steps=ring, context=ctx
        )
        for events in batches:
            pub.publish(events, 0.0)
    return ctx, pubs, {name: len(b) for name, b in by_source.items()}


def main() -> None:
    ctx, pubs, published = start_engines(sys.argv[1])
    try:
        table = {n: [p.endpoint, p.replay_endpoint, published[n], p.stats()["live_blocks"]] for n, p in pubs.items()}
        sys.stdout.write(json.dumps(table) + "\n")
        sys.stdout.flush()
        sys.stdin.read()  # serve until the parent closes our stdin
    finally:
        for p in pubs.values():
            p.close()
        ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
