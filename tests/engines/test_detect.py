"""kvevents.engines.detect: a stream's hash chain told from one chain head (contract, vLLM, other)."""

from __future__ import annotations

import pytest

from kvevents.engines.detect import OTHER, head_chain
from kvevents.engines.vllm_wire import decode_vllm_batch
from kvevents.events import BlockStored
from kvevents.hashing import Namespace, event_hashes_int64
from kvevents.sim.vllm import VllmSimWorker

TOKENS = list(range(100, 112))  # three 4-token pages


@pytest.fixture(autouse=True)
def _no_hash_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # vLLM's default seed, as the sim worker uses


def _contract(salt: str | None = None, parent: int | None = None) -> BlockStored:
    hashes = event_hashes_int64(TOKENS, 4, Namespace(cache_salt=salt))
    return BlockStored(hashes, parent, TOKENS, 4, None, "GPU", None, cache_salt=salt)


def _vllm_heads(algo: str, **serve: object) -> list:
    w = VllmSimWorker(block_size=4, hash_algo=algo)
    w.serve(TOKENS, **serve)  # type: ignore[arg-type]
    payload = w.take_payload()
    assert payload is not None
    return [ev for ev in decode_vllm_batch(payload).events if type(ev).__name__ == "VllmBlockStored"]


@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_a_contract_head_is_the_contract(salt: str | None) -> None:
    assert head_chain(_contract(salt)) == "contract"


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_a_vllm_head_names_its_algo(algo: str, salt: str | None) -> None:
    (ev,) = _vllm_heads(algo, cache_salt=salt)
    assert head_chain(ev) == f"vllm-{algo}"


def test_what_cannot_tell_is_none() -> None:
    assert head_chain(_contract(parent=123)) is None  # not a chain head
    partial = BlockStored([1, 2], None, TOKENS, 4, None, "GPU", None)  # 12 tokens for 2 pages of 4
    assert head_chain(partial) is None
    (lora,) = _vllm_heads("sha256", lora_name="lora-a")  # vLLM hashes the adapter's path: not published
    assert head_chain(lora) is None


def test_hashes_of_no_known_chain_are_other() -> None:
    ev = BlockStored([11, 22, 33], None, TOKENS, 4, None, "GPU", None)
    assert head_chain(ev) == OTHER
