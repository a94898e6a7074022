"""`kvevents conformance stream` against `kvevents serve` as a user starts it (a subprocess); the kit's
command runs in-process through the real entry point."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator

import pytest

from kvevents.cache import RadixCache
from kvevents.conformance.stream import StreamObserver, StreamOptions
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher
from tests.helpers.cli import invoke, one_line_error, spawn
from tests.helpers.cli import invoke as kve

BANNER = re.compile(r"live (\S+) replay (\S+)")


def _serve(*extra: str) -> subprocess.Popen[str]:
    return spawn(
        "serve",
        "--endpoint",
        "tcp://127.0.0.1:*",
        "--page-size",
        "4",
        "--rate",
        "100",
        "--duration",
        "30",
        "--capacity-pages",
        "200",
        "--heartbeat",
        "0.2",
        *extra,
    )


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    proc = _serve(*getattr(request, "param", ()))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = BANNER.search(line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield m.group(1), m.group(2)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.subprocess
def test_kvevents_serve_passes_every_rule(served: tuple[str, str]) -> None:
    live, replay = served
    proc = kve("conformance", "stream", live, "--replay", replay, "--page-size", "4", "--duration", "1.5", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and not report["failed"]
    assert {r["rule"]: r["status"] for r in report["rules"]} == dict.fromkeys(
        [
            "live-frames",
            "batch-shape",
            "seq-increasing",
            "gaps-healed",
            "replay-protocol",
            "hash-recompute",
            "parents-first",
            "removes-live",
            "all-cleared",
            "describe",
            "snapshot",
        ],
        "pass",
    )


@pytest.mark.subprocess
def test_wrong_page_size_fails_with_exit_1(served: tuple[str, str]) -> None:
    live, replay = served
    proc = kve("conformance", "stream", live, "--replay", replay, "--page-size", "16", "--duration", "0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"hash-recompute\s+fail", proc.stdout) and re.search(r"describe\s+fail", proc.stdout)
    assert "Traceback" not in proc.stdout + proc.stderr


def test_start_older_than_the_ring_is_answered_from_the_oldest() -> None:
    """A publisher keeping only 5 batches: the replays from 0 start later, which the protocol allows."""
    cache = RadixCache(2)
    steps = []
    for i in range(23):
        cache.insert([i, i + 1, i + 2, i + 3])
        steps.append(cache.take_events())
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, buffer_steps=5)
    try:
        with StreamObserver(StreamOptions(pub.endpoint, pub.replay_endpoint, 2, reply_timeout=1.0)) as obs:
            for events in steps[:20]:
                pub.publish(events)  # the first ones go out before the kit's SUB has joined
            while not obs.pump(0.02):
                pub.publish([])  # heartbeats until the kit hears one
            for events in steps[20:]:
                pub.publish(events)
            obs.pump(0.1)
            report = obs.finish(quiet=0.05)
    finally:
        pub.close(0)
    assert report.ok, report.table()
    assert report.result("replay-protocol").status.value == "pass"
    assert report.figures["complete"] is False  # the history before the ring is unknown: not checkable


_SERVE_HELP = invoke("serve", "--help").stdout
_HAS_EPOCH_FLAG = "--epoch-in-batch" in _SERVE_HELP


@pytest.mark.skipif(not _HAS_EPOCH_FLAG, reason="kvevents serve has no --epoch-in-batch")
@pytest.mark.subprocess
@pytest.mark.parametrize("served", [("--epoch-in-batch",)], indirect=True)
def test_opt_in_epoch_fails_batch_shape_unless_allowed(served: tuple[str, str]) -> None:
    live, replay = served
    strict = kve("conformance", "stream", live, "--replay", replay, "--page-size", "4", "--duration", "0.5", "--json")
    assert strict.returncode == 1, strict.stdout
    assert json.loads(strict.stdout)["failed"] == ["batch-shape", "snapshot"]  # snapshot batches carry it too
    tolerant = kve(
        "conformance", "stream", live, "--replay", replay, "--page-size", "4", "--duration", "0.5", "--allow-epoch"
    )
    assert tolerant.returncode == 0, tolerant.stdout + tolerant.stderr


_HAS_HTTP_FLAG = "--http" in _SERVE_HELP


@pytest.mark.skipif(not _HAS_HTTP_FLAG, reason="kvevents serve has no --http")
@pytest.mark.subprocess
def test_drive_against_kvevents_serve_http() -> None:
    proc = _serve("--http", "127.0.0.1:0", "--rate", "20")
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        live, replay = BANNER.search(" ".join(lines)).groups()  # type: ignore[union-attr]
        m = re.search(r"http (http://\S+)/v1/completions", " ".join(lines))
        assert m, lines
        out = kve(
            "conformance",
            "drive",
            "--http",
            m.group(1),
            "--endpoint",
            live,
            "--replay",
            replay,
            "--page-size",
            "4",
            "--json",
        )
    finally:
        proc.terminate()
        proc.wait(10)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    statuses = {r["rule"]: r["status"] for r in report["rules"]}
    for rule in (
        "drive-events",
        "adapters-same-hash",
        "salts-differ",
        "hashes-profile",
        "hash-recompute",
        "batch-shape",
    ):
        assert statuses[rule] == "pass", out.stdout


@pytest.mark.skipif("--engine" not in _SERVE_HELP, reason="kvevents serve has no --engine")
@pytest.mark.subprocess
@pytest.mark.parametrize("served", [("--engine", "vllm")], indirect=True)
def test_kvevents_serve_vllm_engine_passes_under_the_vllm_profile(served: tuple[str, str]) -> None:
    live, replay = served
    proc = kve(
        "conformance",
        "stream",
        live,
        "--replay",
        replay,
        "--page-size",
        "4",
        "--duration",
        "1",
        "--profile",
        "vllm-sha256",
        "--lora-path",
        "/adapters/{name}",
        "--json",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    statuses = {r["rule"]: r["status"] for r in json.loads(proc.stdout)["rules"]}
    for rule in ("batch-shape", "hash-recompute", "parents-first", "removes-live"):
        assert statuses[rule] == "pass", proc.stdout


def test_serve_http_bad_address_is_a_usage_error() -> None:
    proc = invoke("serve", "--endpoint", "tcp://127.0.0.1:*", "--http", "nonsense", "--duration", "0.1")
    one_line_error(proc, 2, "--http must be HOST:PORT")


@pytest.mark.subprocess
def test_a_curve_publisher_is_judged_with_the_client_flags(tmp_path) -> None:
    """`conformance stream --curve-server-key --curve-client-cert` checks a CURVE-only publisher
    (live, replay, DESCRIBE, SNAPSHOT all over CURVE); without them nothing arrives and it fails."""
    from kvevents.zeromq.security import generate_keypair

    server, server_secret = generate_keypair(tmp_path / "server", "server")
    client, client_secret = generate_keypair(tmp_path / "client", "client")
    allow = tmp_path / "allow"
    allow.mkdir()
    (allow / "client.key").write_bytes(client.read_bytes())
    proc = _serve("--curve-secret", str(server_secret), "--curve-allow", str(allow))
    try:
        assert proc.stdout is not None
        m = BANNER.search(proc.stdout.readline())
        assert m
        live, replay = m.group(1), m.group(2)
        args = ("conformance", "stream", live, "--replay", replay, "--page-size", "4", "--duration", "1.5", "--json")
        ok = kve(*args, "--curve-server-key", str(server), "--curve-client-cert", str(client_secret))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert json.loads(ok.stdout)["ok"]
        refused = kve(*args[:-2], "0.5", "--reply-timeout", "0.3", "--json")  # nothing can arrive: no need to wait long
        assert refused.returncode == 1 and not json.loads(refused.stdout)["ok"]
    finally:
        proc.terminate()
        proc.wait(10)
