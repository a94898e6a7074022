"""The conformance kit says who says what (issue 29, item 6): DESCRIBE checked against the flag that
set the expectation, the usual OpenAI base URL taken as given, an adapter that never answered as a
usage error, and the pytest plugin's count and option errors as pytest reports them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvevents.cache import RadixCache
from kvevents.conformance.drive import DriveOptions, drive, server_root
from kvevents.conformance.hashkit import AdapterNeverAnswered, golden_cases, run_adapter
from kvevents.conformance.report import Status
from kvevents.conformance.stream import StreamObserver, StreamOptions
from kvevents.sim.http import CompletionsServer, serve_and_publish
from kvevents.sim.worker import SimWorker
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher
from tests.helpers.marks import require


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    yield pub
    pub.close(0)


def test_describe_names_the_flag_not_the_stream(publisher: Publisher) -> None:
    cache = RadixCache(4)
    with StreamObserver(StreamOptions(publisher.endpoint, publisher.replay_endpoint, 32, reply_timeout=1.0)) as obs:
        while not obs.pump(0.02):
            publisher.publish([])  # heartbeats until the kit hears one
        for i in range(5):
            cache.insert([i, i + 1, i + 2, i + 3])
            publisher.publish(cache.take_events())
        obs.pump(0.1)
        report = obs.finish(quiet=0.05)
    describe = report.result("describe")
    assert describe.status is Status.FAIL
    assert any("DESCRIBE's page_size is 4, --page-size says 32" in e for e in describe.examples), describe.examples
    assert not any("the stream says" in e for e in describe.examples)


@pytest.mark.parametrize("given", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_the_openai_base_url_is_not_doubled(given: str) -> None:
    assert server_root(given) == "http://h:8000"


def test_drive_against_the_v1_base_url(publisher: Publisher) -> None:
    sim = SimWorker("w0", page_size=4, capacity_pages=500)
    with CompletionsServer("127.0.0.1:0", lambda r: serve_and_publish(sim, publisher, r)) as srv:
        # timeout 1 s: what a warm-up prompt sent before the kit's SUB joined waits for in vain
        opts = DriveOptions(srv.url + "/v1", publisher.endpoint, publisher.replay_endpoint, page_size=4, timeout=1.0)
        report = drive(opts)
    assert report.result("drive-events").status is Status.PASS, report.table()
    assert report.figures["model"] == "kvevents-sim"


def test_an_adapter_that_never_answers_is_not_a_failed_check(tmp_path: Path) -> None:
    with pytest.raises(AdapterNeverAnswered, match=r"exited \(code \d+\) before its first answer.*no-such"):
        run_adapter(f"sh {tmp_path / 'no-such' / 'adapter.sh'}", golden_cases(), timeout=5)


# ---------------------------------------------------------------- the pytest plugin
def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest with the plugin, as an engine's CI runs it (an interpreter: a subprocess test)."""
    require("subprocess")
    (tmp_path / "test_engine_own.py").write_text("def test_own():\n    assert True\n")
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    cmd = [sys.executable, "-m", "pytest", "-p", "kvevents.conformance.pytest_plugin", "-p", "no:cacheprovider"]
    return subprocess.run([*cmd, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.subprocess
def test_plugin_counts_the_rule_tests_it_runs(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, "--kvevents-endpoint", "tcp://127.0.0.1:1", "--kvevents-page-size", "4",
                   "--kvevents-duration", "0.2")  # fmt: skip
    assert "collected 12 items" in proc.stdout, proc.stdout  # the engine's own test and the 11 rules
    assert "1 failed, 1 passed, 10 skipped" in proc.stdout  # nothing live: live-frames fails, the rest skip


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--kvevents-profile", "bogus"], "--kvevents-profile must be one of"),
        (["--kvevents-http", "ftp://x"], "--kvevents-http must be a URL"),
        (["--kvevents-duration", "-1"], "duration must be >= 0"),
    ],
)
def test_plugin_turns_a_bad_option_into_one_usage_error(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = _pytest(tmp_path, "--kvevents-endpoint", "tcp://127.0.0.1:1", "--kvevents-page-size", "4", *args)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage-error exit
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and needle in errors[0], proc.stdout + proc.stderr
    assert "failed" not in proc.stdout and "passed" not in proc.stdout
