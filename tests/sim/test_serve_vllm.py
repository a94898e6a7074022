"""`kvevents serve --engine vllm`: what a vLLM 0.33 worker publishes, read back through the replay endpoint."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq

from kvevents.engines.vllm import vllm_event_hashes
from kvevents.testing.zeromq import dealer_socket, recv_all
from tests.helpers.cli import invoke, spawn


def _replayed(replay: str, want: int, timeout: float = 20.0) -> list[list[bytes]]:
    """Every batch the publisher keeps, once it has at least `want` (replay from seq 0, asked again until then)."""
    ctx = zmq.Context.instance()
    deadline = time.monotonic() + timeout
    msgs: list[list[bytes]] = []
    while time.monotonic() < deadline:
        d = dealer_socket(ctx, replay)
        d.send_multipart([b"", (0).to_bytes(8, "big")])
        msgs = [m for m in recv_all(d) if m[-2] != b"\xff" * 8]
        d.close()
        if len(msgs) >= want:
            return msgs
    raise AssertionError(f"only {len(msgs)} batches replayed")


@pytest.mark.subprocess
def test_serve_engine_vllm_publishes_vllm_batches():
    proc = spawn(
        "serve",
        "--engine",
        "vllm",
        "--hash-algo",
        "sha256_cbor",
        "--endpoint",
        "tcp://127.0.0.1:*",
        "--replay-endpoint",
        "tcp://127.0.0.1:*",
        "--page-size",
        "4",
        "--rate",
        "200",
        "--duration",
        "6",
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("kvevents serve: worker"), line + (proc.stderr.read() if proc.stderr else "")
        parts = line.split()
        replay = parts[parts.index("replay") + 1]
        msgs = _replayed(replay, 20)
        checked = 0
        for m in msgs:
            batch = msgspec.msgpack.decode(m[-1])
            assert len(batch) == 3 and isinstance(batch[0], float) and batch[2] == 0 and batch[1]  # no heartbeats
            for ev in batch[1]:
                assert ev["type"] in ("BlockStored", "BlockRemoved")
                assert ev["group_idx"] == 0 and all(0 <= h < 2**64 for h in ev["block_hashes"])
                if ev["type"] == "BlockRemoved":
                    assert len(ev["block_hashes"]) == 1
                elif ev["parent_block_hash"] is None and ev.get("extra_keys") is None:
                    assert ev["block_hashes"] == vllm_event_hashes(ev["token_ids"], 4, hash_algo="sha256_cbor")
                    checked += 1
        assert checked >= 1
    finally:
        proc.kill()
        proc.wait()


def test_serve_rejects_an_unknown_engine_or_algo():
    for args in (["--engine", "tgi"], ["--engine", "vllm", "--hash-algo", "xxhash"]):
        proc = invoke("serve", *args, "--duration", "0")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1
