"""A worker is a typed (source, dp_rank) key end to end, and the one rank rule (events.rank_of):
a source named `w#dp1` stays apart from rank 1 of `w`; True and False are not ranks."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.keying import SourceKeyer
from kvevents.consumers.router import PrefixRouter
from kvevents.consumers.service.core import RouterService
from kvevents.consumers.worker_key import WorkerKey, worker_label
from kvevents.events import BlockStored, KVEventBatch, is_rank, rank_of
from kvevents.feed import Delivery, Output, SourceStatus
from kvevents.hashing import Namespace, event_hashes_int64
from kvevents.jetstream.feed import positions_from_records
from kvevents.sim.worker import Request, SimWorker
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source

PAGE = 4
DOC = list(range(3 * PAGE))


def _stored(tokens: list[int], rank: object = None) -> KVEventBatch:
    hashes = event_hashes_int64(tokens, PAGE, Namespace())
    return KVEventBatch(0.0, [BlockStored(hashes, None, tokens, PAGE, None, "GPU", None)], rank)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw, rank, ok",
    [(None, 0, True), (0, 0, True), (3, 3, True), (True, 0, False), (False, 0, False), (-1, 0, False), ("1", 0, False)],
)
def test_the_one_rank_rule(raw, rank, ok):
    assert (rank_of(raw), is_rank(raw)) == (rank, ok)
    assert WorkerKey.of("w", raw) == WorkerKey("w", rank)


def test_a_key_renders_a_label_that_is_never_parsed_back():
    assert (WorkerKey("w").label, WorkerKey("w", 2).label, worker_label("w", 1)) == ("w", "w#dp2", "w#dp1")
    assert WorkerKey("w", 1) != WorkerKey("w#dp1", 0) and WorkerKey("w", 1).label == WorkerKey("w#dp1").label


def test_index_and_router_keep_a_hash_named_source_apart_from_a_rank():
    idx = BlockIndex()
    idx.apply("w", _stored(DOC, 1))  # rank 1 of w: three pages
    idx.apply("w#dp1", _stored(DOC[:PAGE]))  # a source named w#dp1 (rank 0): one page
    a, b = WorkerKey("w", 1), WorkerKey("w#dp1", 0)
    assert idx.worker_keys() == [a, b] and idx.workers() == ["w#dp1", "w#dp1"]  # labels: display only
    assert idx.worker_block_counts() == {a: {"GPU": 3}, b: {"GPU": 1}}
    assert idx.block_counts() == {"w#dp1": {"GPU": 4}}  # the label-keyed display report sums them
    assert idx.keys_for(event_hashes_int64(DOC, PAGE, Namespace())[0]) == {a, b}
    assert dict(idx.keys_by_index()) == {0: a, 1: b}
    ranked = PrefixRouter(idx, PAGE, seed=0).score(DOC)
    assert [(s.key, s.matched_pages) for s in ranked] == [(a, 3), (b, 1)]
    assert [s.worker for s in ranked] == ["w#dp1", "w#dp1"]


def test_load_hints_by_key_and_by_label():
    idx = BlockIndex()
    for name in ("a", "b"):
        idx.apply(name, _stored(DOC))
    r = PrefixRouter(idx, PAGE, seed=0)
    assert r.score(DOC, loads={WorkerKey("a"): 2.0, "b": 1.0})[0].key == WorkerKey("b")
    assert r.score(DOC, loads={"a": 1.0, WorkerKey("b"): 2.0})[0].key == WorkerKey("a")


def test_a_bool_rank_is_counted_and_filed_as_rank_0():
    idx = BlockIndex()
    idx.apply("w", _stored(DOC[:PAGE], True))
    idx.apply("w", _stored(DOC[PAGE : 2 * PAGE], 0))
    assert idx.worker_keys() == [WorkerKey("w", 0)] and idx.counters["bad_rank"] == 1
    keyer = SourceKeyer(PAGE, default_mode="tokens")
    keyer.apply(idx, "v", _stored(DOC, True))
    keyer.reset("v", 0)  # the maps of the rank the batch is filed under
    assert keyer.mapped_blocks("v") == 0


def test_a_record_log_position_of_a_bool_rank_is_rank_0():
    recs = [SimpleNamespace(kind="live", source="w", dp_rank=True, seq=4, epoch=None)]
    got = positions_from_records(recs)
    assert list(got) == [("w", 0)] and got[("w", 0)] == (None, 5)


class _ListFeed:
    """An EventFeed handing out a fixed list of outputs once (a transport that passes ranks as given)."""

    def __init__(self, items: list[Output]) -> None:
        self.items = items

    def start(self) -> _ListFeed:
        return self

    def stop(self) -> None:
        self.items = []

    def poll(self, timeout_s: float = 0.0) -> list[Output]:
        out, self.items = self.items, []
        return out

    def status(self) -> dict[str, SourceStatus]:
        return {"w": SourceStatus("w", "list", None, None, None, False)}

    def counters(self) -> dict[str, int]:
        return {}


def test_the_service_files_a_bool_rank_as_rank_0():
    batch = _stored(DOC, True)
    service = RouterService(feed=_ListFeed([Delivery("w", 7, batch, dp_rank=True)]), page_size=PAGE)  # type: ignore[arg-type]
    assert service.process() == 1
    rows = service.workers_view()["workers"]
    assert [(w["worker"], w["dp_rank"], w["blocks"], w["last_seq"]) for w in rows] == [("w", 0, 3, 7)]
    assert service.applied_seq("w", 0) == 7 and service.index.counters["bad_rank"] == 1
    status, out = service.handle_score(json.dumps({"tokens": DOC}).encode())
    assert status == 200 and (out["best"], out["best_dp_rank"]) == ("w", 0)


def _wait(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_score_and_workers_tell_a_hash_named_source_from_a_rank():
    """Rank 1 of `w` and a source named `w#dp1` over real sockets: /score, /workers and the status
    page's copies by adapter name each one with its own rank and blocks."""
    pubs = {
        "w": Publisher(endpoint=EPH, replay_endpoint=EPH, bind=True, heartbeat_interval_s=0.1, dp_rank=1),
        "w#dp1": Publisher(endpoint=EPH, replay_endpoint=EPH, bind=True, heartbeat_interval_s=0.1),
    }
    sims = {
        "w": SimWorker("w", page_size=PAGE, capacity_pages=64),
        "w#dp1": SimWorker("x", page_size=PAGE, capacity_pages=64),
    }
    service = RouterService([Source(p.endpoint, p.replay_endpoint, n) for n, p in pubs.items()], page_size=PAGE, seed=0)
    service.start()
    try:
        for name, doc in (("w", DOC), ("w#dp1", DOC[:PAGE])):
            sims[name].serve(Request(doc))
            pubs[name].publish(sims[name].take_events())
        _wait(lambda: service.applied_seq("w", 1) is not None and service.applied_seq("w#dp1", 0) is not None, "both")
        status, out = service.handle_score(json.dumps({"tokens": DOC}).encode())
        assert status == 200
        assert [(w["worker"], w["dp_rank"], w["matched_pages"]) for w in out["workers"]] == [
            ("w", 1, 3),
            ("w#dp1", 0, 1),
        ]
        assert (out["best"], out["best_dp_rank"]) == ("w", 1)
        rows = {(w["worker"], w["dp_rank"]): w for w in service.workers_view()["workers"]}
        assert {k: w["blocks"] for k, w in rows.items()} == {("w", 1): 3, ("w#dp1", 0): 1}
        adapters = {(w["worker"], w["dp_rank"]): w["blocks_by_adapter"] for w in service.status_view()["workers"]}
        assert adapters == {("w", 1): {"": 3}, ("w#dp1", 0): {"": 1}}
    finally:
        service.stop()
        for p in pubs.values():
            p.close(timeout=0.2)
