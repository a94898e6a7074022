"""`log inspect --verify --profile vllm*`: recorded vLLM 0.33 streams checked for structure, links and hashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvevents.engines.vllm_wire import encode_vllm_batch, removed_event, stored_event
from kvevents.recordlog import RecordWriter
from kvevents.recordlog.reader import RecordReader
from kvevents.recordlog.verifiers import make_verifier
from kvevents.sim.vllm import VllmSimWorker
from kvevents.sim.worker import Workload
from tests.helpers.cli import invoke

PS = 4


def record(path: Path, payloads: list[bytes], source: str = "v") -> None:
    with RecordWriter(path) as w:
        for seq, p in enumerate(payloads):
            w.write(p, source=source, seq=seq, dp_rank=0)


def sim_stream(algo: str = "sha256", n: int = 120, lora: bool = False) -> list[bytes]:
    sim = VllmSimWorker("v", block_size=PS, capacity_blocks=40, hash_algo=algo, sliding_window_blocks=2)
    out = []
    for i, r in enumerate(Workload(5, page_size=PS, vocab_size=6, adapters=("lora-a",) if lora else ()).take(n)):
        if i == n // 2:
            sim.reset()
        sim.serve_request(r)
        p = sim.take_payload(float(i))
        if p is not None:
            out.append(p)
    return out


def verify(path: Path, profile: str, lora_paths=()):
    v = make_verifier(profile, None, (), lora_paths)
    for rec in RecordReader(path):
        v.feed(rec)
    return v.report


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_a_simulated_vllm_stream_verifies_with_its_profile_only(tmp_path: Path, algo: str) -> None:
    p = tmp_path / "v.kvlog"
    record(p, sim_stream(algo))
    rep = verify(p, f"vllm-{algo}")
    assert rep.ok, rep.violations[:3]
    assert rep.blocks_verified > 100 and rep.blocks_unverifiable > 0  # the window group spans null blocks
    assert verify(p, "vllm").ok
    other = "sha256_cbor" if algo == "sha256" else "sha256"
    bad = verify(p, f"vllm-{other}")
    assert not bad.ok and {v.code for v in bad.violations} == {"hash-mismatch"}


def test_lora_blocks_need_the_adapter_path(tmp_path: Path) -> None:
    p = tmp_path / "v.kvlog"
    record(p, sim_stream(lora=True))
    without = verify(p, "vllm-sha256")
    assert without.ok and without.blocks_unverifiable > 0
    with_path = verify(p, "vllm-sha256", ["lora-a=/adapters/lora-a"])
    assert with_path.ok and with_path.blocks_verified > without.blocks_verified


def test_structure_links_and_removes_are_checked(tmp_path: Path) -> None:
    p = tmp_path / "v.kvlog"
    pays = [
        encode_vllm_batch(1.0, [stored_event([1], None, [1, 2, 3, 4], PS, group_idx=0)], 0),
        encode_vllm_batch(2.0, [stored_event([2], 99, [5, 6, 7, 8], PS, group_idx=0)], 0),  # parent not live
        encode_vllm_batch(3.0, [removed_event([1], group_idx=1)], 0),  # group 1 never stored it
        encode_vllm_batch(4.0, [stored_event([3, 4], None, [1, 2, 3, 4], PS)], 0),  # 4 tokens for 2 blocks
        encode_vllm_batch(5.0, [stored_event([5], None, [1, 2, 3, 4], PS, extra_keys=[["a"], ["b"]])], 0),
        encode_vllm_batch(6.0, [stored_event([[1]], None, [1, 2, 3, 4], PS)], 0),
        b"\xc1",
    ]
    record(p, pays)
    codes = [v.code for v in verify(p, "vllm").violations]
    assert codes == ["parent-missing", "remove-not-live", "token-count", "extra-keys", "bad-hash", "decode"]


def test_cli_inspect_verify_profile(tmp_path: Path) -> None:
    p = tmp_path / "v.kvlog"
    record(p, sim_stream("sha256_cbor", n=40))
    kve = ["log", "inspect", str(p), "--verify"]
    ok = invoke(*kve, "--profile", "vllm-sha256_cbor")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = invoke(*kve, "--profile", "vllm-sha256")
    assert bad.returncode == 1 and "hash-mismatch" in bad.stdout
    usage = invoke(*kve, "--profile", "vllm-xx")
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1
    contract = invoke(*kve)  # a vLLM stream judged by the contract, at its own block_size: one line per kind
    assert contract.returncode == 1 and "(the events' block_size)" in contract.stdout
    assert len([x for x in contract.stdout.splitlines() if x.startswith("violation")]) <= 6
