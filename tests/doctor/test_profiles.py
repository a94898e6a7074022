"""`kvevents doctor --profile` and the profile detected from the stream: a vLLM 0.33 stream recomputes
under vllm-sha256 (no more "storage hashes?" against vLLM), a contract stream under the contract
with the page size from its events; a wrong --profile fails the check, an unknown one is exit 2."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.helpers.cli import invoke, one_line_error
from tests.helpers.live_publisher import LivePublisher


@pytest.fixture(autouse=True)
def _no_hash_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # the sim worker's vLLM seed is the default


@pytest.fixture(scope="module")
def vllm() -> Iterator[LivePublisher]:
    with LivePublisher("vllm", page=4) as p:
        yield p


def _hash_check(out: str) -> dict:
    rep = json.loads(out)
    return next(c for c in rep["checks"] if c["name"] == "published hashes recompute") | {"seen": rep["seen"]}


def test_a_vllm_stream_is_detected_and_recomputes(vllm: LivePublisher) -> None:
    r = invoke("doctor", vllm.endpoint, "--replay", vllm.replay, "--timeout", "1.5", "--json")
    check = _hash_check(r.stdout)
    assert r.returncode == 0, r.stdout
    assert check["status"] == "ok" and "under profile vllm-sha256 (detected from the stream)" in check["detail"]
    assert check["seen"]["profile"] == "vllm-sha256"


def test_the_contract_profile_fails_on_a_vllm_stream_and_vllm_checks_structure(vllm: LivePublisher) -> None:
    r = invoke("doctor", vllm.endpoint, "--profile", "contract", "--page-size", "4", "--timeout", "1", "--json")
    assert r.returncode == 1
    check = _hash_check(r.stdout)
    assert check["status"] == "fail" and "do not recompute under profile contract" in check["detail"]
    r = invoke("doctor", vllm.endpoint, "--profile", "vllm", "--timeout", "1", "--json")
    check = _hash_check(r.stdout)
    assert (
        r.returncode == 0 and check["status"] == "ok" and "well-formed and linked under profile vllm" in check["detail"]
    )


def test_a_contract_stream_is_detected_with_the_page_size_of_its_events() -> None:
    with LivePublisher("contract", page=4) as p:
        r = invoke("doctor", p.endpoint, "--timeout", "1.5", "--json")  # no --replay: no DESCRIBE page size
    check = _hash_check(r.stdout)
    assert r.returncode == 0, r.stdout
    assert "profile contract (detected from the stream); page size 4 from the events' block_size" in check["detail"]


def test_an_unknown_profile_is_one_line_and_exit_2() -> None:
    one_line_error(invoke("doctor", "tcp://127.0.0.1:5557", "--profile", "vllm-xxhash"), 2, "--profile must be one of")
