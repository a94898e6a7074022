"""Optional: NVIDIA Dynamo's standalone KV indexer (PyPI `ai-dynamo-runtime`, the `interop` extra)
reads our default stream: no decode failure, every event applied, and for a workload without LoRA
adapters its `POST /query` scores equal PrefixRouter's.

Skipped unless `dynamo.indexer` is importable here, or KVEVENTS_DYNAMO_PYTHON names a Python that
has it (e.g. a venv made by `pip install 'kvevents[interop]'`). Not run by .ci/run. Known limit of
that consumer (not ours): it keeps one entry per (worker, hash), so a worker holding one hash under
several adapters drifts there (a remove drops its only entry); hence no adapters in this workload.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.router import PrefixRouter
from kvevents.sim.worker import SimWorker, Workload
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Delivery, Reset, Source, Subscriber

PAGE = 16


def _dynamo_python() -> str | None:
    env = os.environ.get("KVEVENTS_DYNAMO_PYTHON")
    if env:
        return env
    return sys.executable if importlib.util.find_spec("dynamo") and importlib.util.find_spec("dynamo.indexer") else None


PY = _dynamo_python()
pytestmark = [
    pytest.mark.skipif(PY is None, reason="ai-dynamo-runtime not installed (pip install 'kvevents[interop]')"),
    pytest.mark.slow,
    pytest.mark.subprocess,
]


def _listening_port(pid: int, timeout: float = 15.0) -> int:
    """The TCP port process `pid` listens on (Dynamo's --port 0 does not print it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:  # LISTEN
                    return int(f[1].rsplit(":", 1)[1], 16)
        time.sleep(0.1)
    raise AssertionError("the Dynamo indexer never listened")


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return json.loads(text) if text.startswith(("{", "[")) else {"text": text}


def test_dynamo_indexer_applies_every_event_and_scores_like_prefix_router(tmp_path):
    load = Workload(5, page_size=PAGE, adapters=(), salts=(None,), num_system_prompts=8)
    requests = load.take(600)
    worker = SimWorker("w0", page_size=PAGE, capacity_pages=3000)
    pub = Publisher(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.2)
    log = (tmp_path / "dynamo.log").open("w")
    dyn = subprocess.Popen(
        [PY, "-m", "dynamo.indexer", "--block-size", str(PAGE), "--port", "0", "--threads", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1"},
    )
    sub = Subscriber([Source(pub.endpoint, pub.replay_endpoint, "1")])
    index = BlockIndex()
    router = PrefixRouter(index, PAGE)
    try:
        port = _listening_port(dyn.pid)
        for r in requests[:200]:  # history before Dynamo registers: it must replay it
            worker.serve(r)
            if evs := worker.take_events():
                pub.publish(evs)
        _post(
            port,
            "/register",
            {
                "instance_id": 1,
                "endpoint": pub.endpoint,
                "replay_endpoint": pub.replay_endpoint,
                "model_name": "m",
                "block_size": PAGE,
            },
        )
        for r in requests[200:]:
            worker.serve(r)
            if evs := worker.take_events():
                pub.publish(evs)
        last = pub.publish([])
        deadline = time.monotonic() + 20
        done = False
        while not done and time.monotonic() < deadline:
            for it in sub.poll(0.05):
                if isinstance(it, Reset):
                    index.drop_source(it.source, it.dp_rank)
                elif isinstance(it, Delivery):
                    index.apply(it.source, it.batch)
                    done = done or it.seq >= last
        assert done and index.copies("1") == +worker.cache.published_copies()
        time.sleep(1.0)  # Dynamo applies asynchronously; nothing to wait on but its log
        probes = [r.tokens for r in requests[-100:]]
        mismatches = []
        for toks in probes:
            ours = {s.worker: s.matched_pages for s in router.score(toks)}
            theirs = _post(port, "/query", {"token_ids": toks, "model_name": "m"}).get("scores", {})
            # {"1": {"0": tokens}}: matched tokens per worker id and dp rank
            got = max(
                (int(x) for v in theirs.values() for x in (v.values() if isinstance(v, dict) else [v])), default=0
            )
            if got != ours.get("1", 0) * PAGE:
                mismatches.append((len(toks), ours, theirs))
        text = (tmp_path / "dynamo.log").read_text()
        assert "Failed to decode" not in text, text[-2000:]
        assert "Failed to apply" not in text, text[-2000:]
        assert not mismatches, mismatches[:5]
    finally:
        sub.stop()
        pub.close()
        dyn.terminate()
        try:
            dyn.wait(10)
        except subprocess.TimeoutExpired:
            dyn.kill()
            dyn.wait()
        log.close()
