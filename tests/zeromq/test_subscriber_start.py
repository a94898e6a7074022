"""Subscriber(start=...): where a stream begins on first contact (oldest, snapshot, now), per
Subscriber or per Source. Real publishers and sockets on 127.0.0.1."""

from __future__ import annotations

import pytest

from kvevents.testing.zeromq import EPH, chain_events, collect
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Delivery, Reset, Source, Subscriber

HISTORY = 6


def _pub(snapshots: bool = True, replay: bool = True) -> Publisher:
    p = Publisher(endpoint=EPH, replay_endpoint=EPH if replay else None, heartbeat_interval_s=0.02, snapshots=snapshots)
    for events in chain_events(1, HISTORY):
        p.publish(events)
    return p


def _first_items(src: Source, until_live: int = 2, **kw: object) -> tuple[list, dict[str, int]]:
    sub = Subscriber([src], request_timeout_s=0.3, **kw)  # type: ignore[arg-type]
    try:
        items = collect(sub, lambda xs: sum(isinstance(x, Delivery) and x.kind == "live" for x in xs) >= until_live)
        return items, sub.counters()
    finally:
        sub.stop()


def test_oldest_is_the_default_and_replays_the_kept_history() -> None:
    pub = _pub()
    try:
        items, c = _first_items(Source(pub.endpoint, pub.replay_endpoint, "w"))
    finally:
        pub.close()
    ds = [x for x in items if isinstance(x, Delivery)]
    assert [(d.kind, d.seq) for d in ds[:HISTORY]] == [("replay", s) for s in range(HISTORY)]
    assert not [x for x in items if isinstance(x, Reset)] and c["losses"] == 0 and c["describes_requested"] >= 1


def test_snapshot_starts_with_a_first_reset_and_the_publishers_state() -> None:
    pub = _pub()
    try:
        items, c = _first_items(Source(pub.endpoint, pub.replay_endpoint, "w"), start="snapshot")
        newest = pub.seq_range()[0]
    finally:
        pub.close()
    assert isinstance(items[0], Reset) and items[0].reason == "first" and items[0].dp_rank == 0
    snap = [x for x in items if isinstance(x, Delivery) and x.kind == "snapshot"]
    assert snap and len({d.seq for d in snap}) == 1
    s = snap[0].seq
    assert HISTORY - 1 <= s <= (newest or 0)
    stored = {h for d in snap for ev in d.batch.events for h in getattr(ev, "block_hashes", [])}
    assert set(range(1, HISTORY + 1)) <= stored  # the whole chain, without its history replayed
    after = [x for x in items if isinstance(x, Delivery) and x.kind != "snapshot"]
    assert after and after[0].seq == s + 1 and [d.seq for d in after] == list(range(s + 1, s + 1 + len(after)))
    assert (
        c["replays_requested"] == 0
        and c["snapshots_applied"] == 1
        and c["losses"] == 0
        and c["describes_requested"] >= 1
    )


def test_snapshot_refused_is_a_counted_clean_start() -> None:
    pub = _pub(snapshots=False)  # vLLM's feature set: KVE/SNAPSHOT gets no reply
    try:
        items, c = _first_items(Source(pub.endpoint, pub.replay_endpoint, "w"), start="snapshot", max_attempts=1)
    finally:
        pub.close()
    assert isinstance(items[0], Reset) and items[0].reason == "first"
    ds = [x for x in items if isinstance(x, Delivery)]
    assert ds and {d.kind for d in ds} == {"live"} and ds[0].seq > HISTORY - 1
    assert c["snapshot_failures"] == 1 and c["losses"] == 1 and c["replays_requested"] == 0


def test_now_starts_at_the_first_live_batch_without_replay_or_loss() -> None:
    pub = _pub()
    try:
        items, c = _first_items(Source(pub.endpoint, pub.replay_endpoint, "w"), start="now")
    finally:
        pub.close()
    ds = [x for x in items if isinstance(x, Delivery)]
    assert ds[0].kind == "live" and ds[0].seq >= HISTORY and not [x for x in items if isinstance(x, Reset)]
    assert [d.seq for d in ds] == list(range(ds[0].seq, ds[0].seq + len(ds)))
    assert c["replays_requested"] == 0 and c["losses"] == 0 and c["describes_requested"] >= 1  # epoch still confirmed


def test_without_a_replay_endpoint_only_oldest_counts_the_late_join_as_a_loss() -> None:
    pub = _pub(replay=False)
    try:
        _, oldest = _first_items(Source(pub.endpoint, None, "w"))
        _, now = _first_items(Source(pub.endpoint, None, "w"), start="now")
    finally:
        pub.close()
    assert oldest["losses"] == 1 and now["losses"] == 0


def test_a_source_may_choose_its_own_start() -> None:
    a, b = _pub(), _pub()
    try:
        sub = Subscriber(
            [Source(a.endpoint, a.replay_endpoint, "a", start="now"), Source(b.endpoint, b.replay_endpoint, "b")],
            request_timeout_s=0.3,
            start="snapshot",
        )
        try:
            items = collect(
                sub, lambda xs: {x.source for x in xs if isinstance(x, Delivery) and x.kind == "live"} == {"a", "b"}
            )
        finally:
            sub.stop()
    finally:
        a.close()
        b.close()
    first = {src: next(x for x in items if x.source == src) for src in ("a", "b")}
    assert isinstance(first["a"], Delivery) and first["a"].kind == "live"
    assert isinstance(first["b"], Reset) and first["b"].reason == "first"


def test_an_unknown_start_is_refused() -> None:
    with pytest.raises(ValueError, match="start must be one of oldest, snapshot, now"):
        Subscriber(["tcp://127.0.0.1:1"], start="later")
    with pytest.raises(ValueError, match="start must be one of"):
        Source("tcp://127.0.0.1:1", start="yesterday")
