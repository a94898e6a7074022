"""kvevents.published: what a source publishes (page size, hash chain) learned from its deliveries,
and the one-line notes a command prints per source."""

from __future__ import annotations

from kvevents.events import AllBlocksCleared, BlockStored, KVEventBatch
from kvevents.feed import Delivery, Reset, SourceStatus
from kvevents.hashing import Namespace, event_hashes_int64
from kvevents.published import PublishedWatch, SourceNotes, mismatch
from tests.helpers.payloads import batch

TOKENS = list(range(200, 216))


def _delivery(source: str, events: list, payload: bool = True) -> Delivery:
    b = KVEventBatch(1.0, events, 0)
    return Delivery(source, 0, b, batch(events) if payload else b"")


def _head(page: int) -> BlockStored:
    return BlockStored(event_hashes_int64(TOKENS, page, Namespace()), None, TOKENS, page, None, "GPU", None)


def test_the_watch_learns_page_size_and_chain_from_the_first_stores() -> None:
    w = PublishedWatch()
    w.observe_all([Reset("a", 0, "first"), _delivery("a", [AllBlocksCleared()]), _delivery("b", [_head(4)], False)])
    assert w.page_size("a") is None and w.hash_chain("a") is None  # nothing stored yet
    assert (w.page_size("b"), w.hash_chain("b")) == (4, "contract")
    w.observe_all([_delivery("a", [_head(8)])])
    st = w.fill(SourceStatus("a", "tcp://x:1", None, None, None, False))
    assert (st.page_size, st.hash_chain) == (8, "contract")


def test_a_stream_without_a_conclusive_head_is_called_other_in_the_end() -> None:
    w = PublishedWatch(undecided_after=3)
    child = BlockStored([5], 99, TOKENS[:4], 4, None, "GPU", None)
    for _ in range(2):
        w.observe_all([_delivery("a", [child])])
    assert w.page_size("a") == 4 and w.hash_chain("a") is None
    w.observe_all([_delivery("a", [child])])
    assert w.hash_chain("a") == "other"


def _status(name: str = "w0", **kw: object) -> SourceStatus:
    st = SourceStatus(name, "tcp://127.0.0.1:5557", None, None, None, False)
    for k, v in kw.items():
        setattr(st, k, v)
    return st


def test_notes_say_a_page_size_mismatch_once_and_name_the_flag() -> None:
    notes = SourceNotes(page_size=32, key_mode=lambda name: "auto")
    st = _status(page_size=16, hash_chain="contract")
    assert notes.lines({"w0": st}) == [
        "w0: publishes 16-token pages but --page-size is 32: none of its blocks can be indexed or matched "
        "(give --page-size 16)"
    ]
    assert notes.lines({"w0": st}) == []  # once


def test_notes_say_what_a_source_publishes_once_its_key_mode_is_known() -> None:
    modes = {"w0": "auto"}
    notes = SourceNotes(page_size=16, key_mode=modes.__getitem__)
    st = _status(page_size=16, hash_chain="vllm-sha256", replay_framing="4-frame")
    assert notes.lines({"w0": st}) == []  # still detecting
    modes["w0"] = "tokens"
    assert notes.lines({"w0": st}) == [
        "w0: publishes 16-token pages, vLLM sha256 hashes, replay framing 4-frame; keyed as tokens"
    ]
    assert notes.lines({"w0": st}) == []


def test_notes_flag_contract_keying_of_another_chain_and_say_problems_again_after_they_clear() -> None:
    st = _status(page_size=16, hash_chain="other")
    assert "key mode is contract" in str(mismatch(st, 16, "contract"))
    notes = SourceNotes()
    st.problem = "tcp://127.0.0.1:5557 requires CURVE"
    assert notes.lines({"w0": st}) == [
        "w0: publishes 16-token pages, hashes of its own (not the contract's chain)",
        "w0: tcp://127.0.0.1:5557 requires CURVE",
    ]
    assert notes.lines({"w0": st}) == []
    st.problem = None
    assert notes.lines({"w0": st}) == []
    st.problem = "tcp://127.0.0.1:5557 requires CURVE"
    assert notes.lines({"w0": st}) == ["w0: tcp://127.0.0.1:5557 requires CURVE"]
