"""The reference cache reproduces SGLang 0.5.20's golden events, event for event (the contract, "What the reference cache emits")."""

from __future__ import annotations

from typing import Any

import pytest

from kvevents.cache import RadixCache
from kvevents.events import event_to_dict
from kvevents.hashing import Namespace

A = list(range(100, 112))
B = [100, 101, 102, 103, *range(200, 208)]
C = A + [300, 301, 302, 303]


def as_golden(events: list[Any]) -> list[dict[str, Any]]:
    """Our events as the golden file renders them (SGLang has no lora_name field; ours is None)."""
    out = []
    for ev in events:
        d = event_to_dict(ev)
        assert d.pop("lora_name", None) is None
        out.append(d)
    return out


def strip(expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "lora_name"} for e in expected]


def scenario_steps(cache: RadixCache) -> list[list[Any]]:
    """Run the golden scenario's steps, one event list per step."""
    steps = [cache.take_events()]
    cache.insert(A)
    steps.append(cache.take_events())
    cache.insert(B)
    steps.append(cache.take_events())
    cache.insert(C)
    steps.append(cache.take_events())
    assert cache.insert(A) == len(A)
    steps.append(cache.take_events())
    assert cache.evict(10**6) == 6
    steps.append(cache.take_events())
    cache.reset()
    steps.append(cache.take_events())
    cache.insert(A[:4])
    cache.insert(A[:8])
    steps.append(cache.take_events())
    return steps


SCENARIO_NS = {"ps4_ns_None_None": Namespace(), "ps4_ns_lora-a_tenant-a": Namespace("lora-a", "tenant-a")}


@pytest.mark.parametrize("name", sorted(SCENARIO_NS))
def test_golden_scenario_event_for_event(golden: dict, name: str) -> None:
    spec = golden["scenarios"][name]
    ns = SCENARIO_NS[name]
    cache = RadixCache(4)

    class NS:  # run the steps under the scenario's namespace
        def __getattr__(self, attr: str) -> Any:
            fn = getattr(cache, attr)
            if attr in ("insert", "match_prefix"):
                return lambda tokens: fn(tokens, ns)
            return fn

    steps = scenario_steps(NS())  # type: ignore[arg-type]
    expected = [s for s in spec if "events" in s]
    assert len(steps) == len(expected)
    for got, want in zip(steps, expected):
        assert as_golden(got) == strip(want["events"]), want["step"]
        if "tokens" in want:
            assert "insert" in want["step"]


@pytest.mark.parametrize("name", sorted(SCENARIO_NS))
def test_golden_scenario_wire_bytes(golden: dict, name: str) -> None:
    """Golden wire bytes are SGLang's (no lora_name key); decoding them gives our last step's events."""
    from kvevents.events import decode_batch

    spec = golden["scenarios"][name]
    wire = next(s for s in spec if any(k.startswith("wire_") and k.endswith("_hex") for k in s))
    key = next(k for k in wire if k.startswith("wire_") and k.endswith("_hex"))
    batch = decode_batch(bytes.fromhex(wire[key]))
    cache = RadixCache(4)
    cache.take_events()
    cache.insert(A[:4], SCENARIO_NS[name])
    cache.insert(A[:8], SCENARIO_NS[name])
    assert [event_to_dict(e) for e in batch.events] == [event_to_dict(e) for e in cache.take_events()]


def test_golden_cases(golden: dict) -> None:
    """Every case: insert parent_tokens (take), then parent + tokens; the new node's BlockStored."""
    assert golden["cases"]
    for case in golden["cases"]:
        inp = case["inputs"]
        ns = Namespace(inp["extra_key"], inp["cache_salt"])
        cache = RadixCache(inp["page_size"])
        assert as_golden(cache.take_events()) == [{"type": "AllBlocksCleared"}]
        parent = inp["parent_tokens"] or []
        if parent:
            cache.insert(parent, ns)
            assert as_golden(cache.take_events()) == strip(case["events"]["parent_events"]), case["id"]
        assert cache.insert(parent + inp["tokens"], ns) == len(parent)
        assert as_golden(cache.take_events()) == strip(case["events"]["block_stored_events"]), case["id"]
        m = cache.match_prefix(parent + inp["tokens"], ns)
        assert m.event_hashes[len(parent) // inp["page_size"] :] == case["events"]["event_hashes_hex"], case["id"]
        assert m.storage_hashes[len(parent) // inp["page_size"] :] == case["storage"]["storage_hashes_hex"], case["id"]
        if parent:
            assert m.storage_hashes[: len(parent) // inp["page_size"]] == case["storage"]["parent_storage_hashes_hex"]
            assert m.event_hashes[: len(parent) // inp["page_size"]] == case["events"]["parent_event_hashes_hex"]
        assert cache.take_events() == []  # matches emit nothing


def test_cases_cover_namespace_kinds(golden: dict) -> None:
    kinds = {(c["inputs"]["extra_key"] is not None, c["inputs"]["cache_salt"] is not None) for c in golden["cases"]}
    assert kinds == {(False, False), (True, False), (False, True), (True, True)}
