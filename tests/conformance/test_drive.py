"""`conformance drive` through the simulated OpenAI-compatible endpoint (contract and vLLM
workers), an engine that lets the adapter move its hashes, and the pytest plugin as a CI runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvevents.conformance.drive import DriveOptions, drive
from kvevents.conformance.report import Status
from kvevents.hashing import Namespace
from kvevents.sim.http import CompletionsServer, serve_and_publish
from kvevents.sim.vllm import VllmSimWorker
from kvevents.sim.worker import Request, SimWorker
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher
from tests.helpers.conformance_fakes import FakeEngine
from tests.helpers.marks import require
from tests.helpers.payloads import batch as payload

DRIVE_RULES = ("drive-events", "adapters-same-hash", "salts-differ", "hashes-profile")


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    yield pub
    pub.close(0)


def _drive(pub: Publisher, handle: Callable[[Request], int], **kw: Any) -> Any:
    # timeout 1 s: a loopback worker's events come in milliseconds; a warm-up prompt sent before the
    # kit's SUB joined waits the whole timeout for events that never come
    with CompletionsServer("127.0.0.1:0", handle) as srv:
        return drive(DriveOptions(srv.url, pub.endpoint, pub.replay_endpoint, timeout=1.0, **kw))


def test_contract_worker_passes_every_drive_and_stream_rule(publisher: Publisher) -> None:
    sim = SimWorker("w0", page_size=4, capacity_pages=500)
    report = _drive(publisher, lambda r: serve_and_publish(sim, publisher, r), page_size=4)
    assert report.ok, report.table()
    for rule in DRIVE_RULES:
        assert report.result(rule).status is Status.PASS, report.table()
    assert report.result("hash-recompute").status is Status.PASS
    assert report.figures["model"] == "kvevents-sim"


def test_vllm_worker_under_its_profile(publisher: Publisher) -> None:
    sim = VllmSimWorker("v0", block_size=4, capacity_blocks=500, hash_algo="sha256_cbor")
    report = _drive(
        publisher,
        lambda r: serve_and_publish(sim, publisher, r),
        page_size=4,
        profile="vllm-sha256_cbor",
        lora_path="/adapters/{name}",
    )
    assert report.ok, report.table()
    assert report.result("adapters-same-hash").status is Status.NOT_OFFERED  # vLLM hashes the adapter in
    for rule in ("salts-differ", "hashes-profile", "hash-recompute", "batch-shape"):
        assert report.result(rule).status is Status.PASS, report.table()
    # the same vLLM stream judged as a contract engine: its hashes are not the contract's
    sim2 = VllmSimWorker("v1", block_size=4, capacity_blocks=500)
    wrong = _drive(publisher, lambda r: serve_and_publish(sim2, publisher, r), page_size=4)
    assert {"hashes-profile", "hash-recompute"} <= set(wrong.failed()), wrong.table()


def test_adapter_that_moves_hashes_fails_adapters_same_hash(publisher: Publisher) -> None:
    """An engine seeding its published chain with the adapter (as if extra_key were the salt)."""
    sim = SimWorker("w0", page_size=4, capacity_pages=500)

    def leaky(req: Request) -> int:
        ns = req.namespace
        moved = Request(req.tokens, Namespace(ns.extra_key, ns.cache_salt or ns.extra_key), req.lora_name)
        return serve_and_publish(sim, publisher, moved)

    report = _drive(publisher, leaky, page_size=4)
    assert "adapters-same-hash" in report.failed(), report.table()
    assert "hashes-profile" in report.failed()
    assert "extra_key moved a published hash" in report.result("adapters-same-hash").detail


def test_completions_endpoint_speaks_openai(publisher: Publisher) -> None:
    sim = SimWorker("w0", page_size=4, capacity_pages=100)
    with CompletionsServer("127.0.0.1:0", lambda r: serve_and_publish(sim, publisher, r)) as srv:
        body = {"model": "lora-a", "prompt": list(range(1, 13)), "max_tokens": 1, "cache_salt": "t"}
        for expect_cached in (0, 12):
            req = urllib.request.Request(
                srv.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=5) as resp:
                out = json.loads(resp.read())
            assert out["object"] == "text_completion" and out["model"] == "lora-a"
            assert out["usage"]["prompt_tokens"] == 12
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == expect_cached
        bad = urllib.request.Request(srv.url + "/v1/completions", json.dumps({"prompt": "text"}).encode())
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=5)
        assert err.value.code == 400 and b"token ids" in err.value.read()
        with urllib.request.urlopen(srv.url + "/v1/models", timeout=5) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "kvevents-sim"
    assert sim.requests == 2


def test_drive_against_nothing_is_a_usage_error(publisher: Publisher) -> None:
    with pytest.raises(ValueError, match="v1/models"):
        drive(DriveOptions("http://127.0.0.1:9", publisher.endpoint, page_size=4, timeout=0.5))


# ---------------------------------------------------------------- the pytest plugin


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest with the conformance plugin, as an engine's CI runs it (an interpreter: a subprocess test)."""
    require("subprocess")
    (tmp_path / "test_engine_own.py").write_text("def test_own():\n    assert True\n")
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # the plugin is loaded explicitly (installed or not)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "kvevents.conformance.pytest_plugin",
            "-q",
            "-rfs",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.subprocess
def test_plugin_is_inert_without_options(tmp_path: Path) -> None:
    proc = _pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


@pytest.mark.subprocess
def test_plugin_runs_the_rules_as_tests(tmp_path: Path, publisher: Publisher) -> None:
    sim = SimWorker("w0", page_size=4, capacity_pages=60)
    stop = threading.Event()

    def engine() -> None:
        from kvevents.sim.worker import Workload

        load = iter(Workload(3, page_size=4, user_tokens=(4, 30), answer_tokens=(4, 30), system_prompt_pages=(1, 4)))
        while not stop.is_set():
            sim.serve(next(load))
            serve_events = sim.take_events()
            if serve_events:
                publisher.publish(serve_events)
            time.sleep(0.01)

    th = threading.Thread(target=engine, daemon=True)
    th.start()
    try:
        proc = _pytest(
            tmp_path,
            "--kvevents-endpoint",
            publisher.endpoint,
            "--kvevents-replay",
            publisher.replay_endpoint,
            "--kvevents-page-size",
            "4",
            "--kvevents-duration",
            "0.8",
            "--junitxml",
            str(tmp_path / "j.xml"),
        )
    finally:
        stop.set()
        th.join(5)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    xml = (tmp_path / "j.xml").read_text()
    assert xml.count("<testcase") == 12  # the engine's own test and the 11 rules
    assert 'kvevents-conformance.stream" name="hash-recompute"' in xml


@pytest.mark.subprocess
def test_plugin_fails_the_broken_rule(tmp_path: Path) -> None:
    eng = FakeEngine(replay=False)
    stop = threading.Event()

    def send() -> None:
        eng.wait_joined(20)
        for seq in range(1000):
            if stop.is_set():
                return
            eng.send(seq, payload([], epoch=1))  # the opt-in epoch without --kvevents-allow-epoch
            time.sleep(0.02)

    th = threading.Thread(target=send, daemon=True)
    th.start()
    try:
        proc = _pytest(
            tmp_path, "--kvevents-endpoint", eng.endpoint, "--kvevents-page-size", "4", "--kvevents-duration", "0.5"
        )
    finally:
        stop.set()
        th.join(5)
        eng.close()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "stream::batch-shape" in proc.stdout
    assert "4 elements" in proc.stdout
    assert "SKIPPED" in proc.stdout  # describe / snapshot: not offered


@pytest.mark.subprocess
def test_plugin_runs_the_drive_checks_with_kvevents_http(tmp_path: Path, publisher: Publisher) -> None:
    sim = SimWorker("w0", page_size=4, capacity_pages=500)
    with CompletionsServer("127.0.0.1:0", lambda r: serve_and_publish(sim, publisher, r)) as srv:
        proc = _pytest(
            tmp_path,
            "--kvevents-endpoint",
            publisher.endpoint,
            "--kvevents-replay",
            publisher.replay_endpoint,
            "--kvevents-page-size",
            "4",
            "--kvevents-http",
            srv.url,
            "--junitxml",
            str(tmp_path / "j.xml"),
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    xml = (tmp_path / "j.xml").read_text()
    for rule in DRIVE_RULES:
        assert f'kvevents-conformance.drive" name="{rule}"' in xml
    assert xml.count("<testcase") == 1 + len(DRIVE_RULES) + 11


def test_server_whose_events_go_elsewhere_fails_drive_events(publisher: Publisher) -> None:
    """The HTTP server serves, but nothing reaches the endpoint the kit watches: one clear failure, quickly."""
    sim = SimWorker("w0", page_size=4, capacity_pages=500)
    started = time.monotonic()
    with CompletionsServer("127.0.0.1:0", lambda r: sim.serve(r).device_hit_tokens) as srv:
        report = drive(DriveOptions(srv.url, publisher.endpoint, publisher.replay_endpoint, page_size=4, timeout=0.5))
    assert report.failed()[0] == "drive-events", report.table()
    assert report.result("adapters-same-hash").status is Status.NOT_CHECKABLE
    assert time.monotonic() - started < 10
