"""`kvevents demo` and `kvevents route` as a user runs them: `route` and one time-bound demo as
subprocesses; the reproducible `--requests N --json` demos and bad flags in-process (the demo
starts its own publishers and router either way)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import time

import pytest

from kvevents.sim.worker import Request, SimWorker
from kvevents.zeromq.publisher import Publisher
from tests.helpers.cli import invoke, run, spawn


def test_demo_json_exits_0_with_every_check_true():
    proc = invoke("demo", "--requests", "300", "--json", "--seed", "2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["checks"] and all(out["checks"].values()), out["checks"]
    assert out["ok"] is True
    t = out["transport"]
    assert t["events_published"] > 0 and t["events_applied"] > 0
    assert t["gaps_healed_by_replay"] >= 1 and t["restarts_detected"] >= 1
    assert set(out["policies"]) == {"prefix", "random", "round_robin"}
    assert out["contract"]["stored_events_under_extra_key"] > 0
    # the prefix router's raison d'etre: more prompt tokens found on the chosen worker's device
    assert out["policies"]["prefix"]["device_hit_rate"] > out["policies"]["random"]["device_hit_rate"]


def test_demo_one_worker_heals_the_drop_before_the_restart():
    """With one worker the drop and the restart hit the same publisher: replay must heal first."""
    for seed in ("0", "5"):
        proc = invoke("demo", "--workers", "1", "--requests", "150", "--json", "--seed", seed)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert all(out["checks"].values()), out["checks"]
        assert out["transport"]["batches_replayed"] >= 1


def test_demo_waits_for_a_router_that_joins_late(monkeypatch):
    """A router whose subscriptions come up after the restart time would see the restarted
    publisher as a first contact: the demo starts its clock only once every stream is followed."""
    import threading

    from kvevents.consumers.service.core import RouterService
    from kvevents.demo.run import DemoConfig, run_demo

    start = RouterService.start

    def late_start(self):
        timer = threading.Timer(1.6, start, args=(self,))  # past the restart time of a 2 s run
        timer.start()
        return self

    monkeypatch.setattr(RouterService, "start", late_start)
    out = run_demo(DemoConfig(workers=2, duration=2.0, seed=4))  # 2 s: enough traffic for every check on a loaded box
    assert out["checks"]["injected_faults_observed"], out["transport"]
    assert out["transport"]["restarts_detected"] == 1
    assert out["ok"], out["checks"]


def test_demo_rejects_bad_flags_with_exit_2():
    proc = invoke("demo", "--workers", "0", "--duration", "1")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--workers" in proc.stderr
    proc = invoke("demo", "--duration", "-1")
    assert proc.returncode == 2 and "duration" in proc.stderr


def test_route_rejects_a_bad_publisher_spec():
    proc = invoke("route", "--publisher", "nonsense", "--http", "127.0.0.1:0")
    assert proc.returncode == 2 and "NAME=ENDPOINT" in proc.stderr
    proc = invoke("route", "--publisher", "a=tcp://127.0.0.1:1", "--http", "127.0.0.1:x")
    assert proc.returncode == 2 and "--http" in proc.stderr


@pytest.mark.subprocess
def test_route_serves_scores_from_a_live_publisher():
    pub = Publisher(
        endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", bind=True, heartbeat_interval_s=0.1
    )
    worker = SimWorker("w", page_size=4)
    proc = spawn(
        "route",
        "--publisher",
        f"engine-0={pub.endpoint},{pub.replay_endpoint}",
        "--http",
        "127.0.0.1:0",
        "--page-size",
        "4",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        banner = proc.stderr.readline()  # port 0: the service names the port it bound
        found = re.search(r"http://127\.0\.0\.1:(\d+) ", banner)
        assert found, banner
        port = int(found.group(1))
        tokens = list(range(40))
        worker.serve(Request(tokens))
        pub.publish(worker.take_events())
        deadline = time.monotonic() + 20
        best = None
        while time.monotonic() < deadline and best != "engine-0":
            time.sleep(0.1)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request(
                    "POST", "/score", body=json.dumps({"tokens": tokens}), headers={"Content-Type": "application/json"}
                )
                resp = conn.getresponse()
                body = json.loads(resp.read())
                conn.close()
            except OSError:
                continue
            best = body.get("best")
        assert best == "engine-0"
        assert body["workers"][0]["matched_pages"] == 10
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pub.close(timeout=0.2)
    assert proc.returncode == 0, proc.stderr.read()


@pytest.mark.subprocess
def test_demo_tables_exit_0():
    proc = run("demo", "--duration", "1", "--workers", "2", "--seed", "4")
    assert proc.returncode == 0, proc.stderr
    for needle in (
        "events published",
        "gaps detected / healed by replay",
        "resyncs by snapshot",
        "prefix router (served)",
        "round-robin (shadow)",
        "router_index_equals_worker_caches",
        "PASS",
    ):
        assert needle in proc.stdout
    assert "FAIL" not in proc.stdout


def test_demo_mixed_fleet_routes_vllm_workers_like_contract_workers():
    """The default fleet: 2 contract + 2 vLLM 0.33 workers, one router keying each source right."""
    proc = invoke("demo", "--requests", "200", "--json", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["fleet"] == "mixed" and sorted(out["engines"].values()) == ["contract", "contract", "vllm", "vllm"]
    assert out["checks"]["key_mode_detected_per_source"] and out["checks"]["vllm_prefix_found_as_on_contract_worker"]
    assert {w: m for w, m in out["key_modes"].items() if out["engines"][w] == "vllm"} == {
        "vllm-2": "tokens",
        "vllm-3": "tokens",
    }
    probe = out["vllm_probe"]["matched_pages"]
    assert probe["prefix"] == {"contract": 8, "vllm": 8} and probe["longer"] == {"contract": 8, "vllm": 8}
    assert out["checks"]["router_index_equals_worker_caches"]  # vLLM workers' caches, keyed by tokens, included


def test_demo_contract_fleet_and_a_bad_fleet():
    proc = invoke("demo", "--requests", "100", "--workers", "2", "--json", "--fleet", "contract", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (
        set(out["engines"].values()) == {"contract"} and "vllm_prefix_found_as_on_contract_worker" not in out["checks"]
    )
    bad = invoke("demo", "--duration", "1", "--fleet", "sglang")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--fleet" in bad.stderr
