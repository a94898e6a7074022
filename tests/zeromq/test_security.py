"""Opt-in CURVE on the live PUB and the replay ROUTER (kvevents/zeromq/security.py): real sockets on
127.0.0.1, real key files in tmp dirs, the CLI as a subprocess (in-process for keys and usage errors)."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import zmq

from kvevents.events import decode_batch
from kvevents.testing.zeromq import EPH, chain_events, collect
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.security import (
    CurveClient,
    CurveServer,
    apply_client,
    exposed_endpoints,
    generate_keypair,
    load_keypair,
    load_public_key,
)
from kvevents.zeromq.subscriber import Delivery, Source, Subscriber
from kvevents.zeromq.wire import pack_seq
from tests.helpers.cli import argv as _kv
from tests.helpers.cli import invoke, run


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, Path]:
    """A server keypair, one allowed client (its public cert in allow/), one client not allowed."""
    out: dict[str, Path] = {}
    out["server"], out["server_secret"] = generate_keypair(tmp_path / "server", "server")
    out["client"], out["client_secret"] = generate_keypair(tmp_path / "client", "client")
    out["other"], out["other_secret"] = generate_keypair(tmp_path / "other", "other")
    allow = tmp_path / "allow"
    allow.mkdir()
    (allow / "client.key").write_bytes(out["client"].read_bytes())
    out["allow"] = allow
    return out


def _curve_pub(keys: dict[str, Path], allow: bool = True) -> Publisher:
    return Publisher(
        endpoint=EPH,
        replay_endpoint=EPH,
        heartbeat_interval_s=0.05,
        curve_secret_key_file=str(keys["server_secret"]),
        curve_allow_dir=str(keys["allow"]) if allow else None,
    )


def _received(src: Source, until: int = 0) -> list:
    """What a Subscriber on `src` gets: in 0.5 s (until=0, for clients that must get nothing: ten
    heartbeat intervals, an allowed client has its first batch in a few ms), or
    once `until` deliveries arrived (10 s at most: a loaded machine may be slow to shake hands)."""
    sub = Subscriber([src], request_timeout_s=0.5)
    got: list = []
    try:
        if until:
            return collect(sub, lambda xs: sum(isinstance(x, Delivery) for x in xs) >= until, timeout=10.0)
        for _ in range(20):
            got.extend(sub.poll(0.025))
    finally:
        sub.stop()
    return got


# ---------------------------------------------------------------- key files
def test_generated_keys_are_pyzmqs_certificates_and_the_secret_is_private(tmp_path: Path) -> None:
    public, secret = generate_keypair(tmp_path / "k", "engine0")
    assert (public.name, secret.name) == ("engine0.key", "engine0.key_secret")
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    pk, sk = zmq.auth.load_certificate(str(secret))  # pyzmq reads them as its own
    assert load_keypair(secret) == (pk, sk) and load_public_key(public) == pk
    assert zmq.auth.load_certificate(str(public))[1] is None
    with pytest.raises(ValueError, match="never overwritten"):
        generate_keypair(tmp_path / "k", "engine0")
    with pytest.raises(ValueError, match="no secret key"):
        load_keypair(public)
    with pytest.raises(ValueError, match="no such key file"):
        load_public_key(tmp_path / "missing.key")
    (tmp_path / "junk.key").write_text("hello\n")
    with pytest.raises(ValueError, match="no public key"):
        load_public_key(tmp_path / "junk.key")
    with pytest.raises(ValueError, match="No public key found in .*junk.key"):
        CurveServer.from_files(secret, tmp_path)  # an allow-list entry that is not a certificate
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no client certificate"):
        CurveServer.from_files(secret, tmp_path / "empty")
    with pytest.raises(ValueError, match="curve_allow_dir needs curve_secret_key_file"):
        Publisher(endpoint=EPH, curve_allow_dir=str(tmp_path))


# ---------------------------------------------------------------- who receives what
def test_an_allowed_client_receives_replay_and_live_batches(keys: dict[str, Path]) -> None:
    pub = _curve_pub(keys)
    try:
        for events in chain_events(1, 5):
            pub.publish(events)
        client = CurveClient.from_files(keys["server"], keys["client_secret"])
        sub = Subscriber([Source(pub.endpoint, pub.replay_endpoint, "w", curve=client)], request_timeout_s=1.0)
        try:
            got = collect(sub, lambda items: sum(isinstance(i, Delivery) and i.kind == "live" for i in items) >= 2)
        finally:
            sub.stop()
        ds = [i for i in got if isinstance(i, Delivery)]
        assert [d.seq for d in ds[:5]] == [0, 1, 2, 3, 4] and {d.kind for d in ds[:5]} == {"replay"}
        assert ds[0].batch.events == chain_events(1, 5)[0]
        assert pub.stats()["curve_denied"] == 0
    finally:
        pub.close()


def test_clients_without_the_keys_receive_nothing_and_the_publisher_goes_on(
    keys: dict[str, Path], ctx: zmq.Context
) -> None:
    pub = _curve_pub(keys)
    try:
        pub.publish(chain_events(1, 1)[0])
        stranger = CurveClient.from_files(keys["server"], keys["other_secret"])  # right server key, not allowed
        wrong_server = CurveClient.from_files(keys["client"], keys["client_secret"])  # allowed, wrong server key
        for src in (
            Source(pub.endpoint, pub.replay_endpoint, "w", curve=stranger),
            Source(pub.endpoint, pub.replay_endpoint, "w", curve=wrong_server),
            Source(pub.endpoint, pub.replay_endpoint, "w"),
        ):  # plain
            assert _received(src) == []
        # the replay ROUTER answers nobody without the keys either
        for client in (stranger, None):
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            apply_client(d, client)
            d.connect(pub.replay_endpoint)  # type: ignore[arg-type]
            d.send_multipart([b"", pack_seq(0)], zmq.NOBLOCK)
            assert d.poll(500) == 0
            d.close(0)
        assert pub.stats()["curve_denied"] >= 1
        # still publishing, and an allowed client gets its history and live batches
        pub.publish(chain_events(2, 1)[0])
        ok = CurveClient.from_files(keys["server"], keys["client_secret"])
        got = _received(Source(pub.endpoint, pub.replay_endpoint, "w", curve=ok), until=2)
        assert [d.seq for d in got if isinstance(d, Delivery)][:2] == [0, 1]
    finally:
        pub.close()


def test_without_an_allow_list_any_client_with_the_server_key_receives(keys: dict[str, Path]) -> None:
    pub = _curve_pub(keys, allow=False)
    try:
        pub.publish(chain_events(1, 1)[0])
        anyone = CurveClient.from_files(keys["server"])  # a throwaway client keypair
        got = _received(Source(pub.endpoint, pub.replay_endpoint, "w", curve=anyone), until=1)
        assert got and isinstance(got[0], Delivery) and got[0].seq == 0 and got[0].kind == "replay"
        assert _received(Source(pub.endpoint, pub.replay_endpoint, "w")) == []  # still not in clear
    finally:
        pub.close()


# ---------------------------------------------------------------- the plain-bind warning
def test_a_plain_non_loopback_bind_warns_once_and_loopback_or_curve_does_not(
    keys: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    assert exposed_endpoints(
        "tcp://0.0.0.0:1",
        "tcp://*:2",
        "tcp://127.0.0.1:3",
        "tcp://[::1]:4",
        "tcp://localhost:5",
        "ipc:///tmp/x",
        "inproc://y",
        None,
        "tcp://10.0.0.1:6",
    ) == ["tcp://0.0.0.0:1", "tcp://*:2", "tcp://10.0.0.1:6"]
    with caplog.at_level(logging.WARNING, logger="kvevents.zeromq.publisher"):
        Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0).close()
        Publisher(
            endpoint="tcp://0.0.0.0:*", heartbeat_interval_s=0, curve_secret_key_file=str(keys["server_secret"])
        ).close()
        assert not [r for r in caplog.records if "without CURVE" in r.getMessage()]
        # bound only to read the warning: nothing connects, no traffic leaves the machine
        Publisher(endpoint="tcp://0.0.0.0:*", heartbeat_interval_s=0).close()
    lines = [r.getMessage() for r in caplog.records if "without CURVE" in r.getMessage()]
    assert len(lines) == 1 and "tcp://0.0.0.0:" in lines[0] and "\n" not in lines[0]


# ---------------------------------------------------------------- the CLI end to end
@pytest.mark.subprocess
def test_cli_keys_serve_and_tail_with_curve(tmp_path: Path) -> None:
    r = invoke("keys", "generate", str(tmp_path / "srv"), "--name", "engine")
    assert r.returncode == 0 and "engine.key_secret" in r.stdout, r.stderr
    r = invoke("keys", "generate", str(tmp_path / "allow"), "--name", "router")
    assert r.returncode == 0, r.stderr
    srv_key, srv_secret = tmp_path / "srv" / "engine.key", tmp_path / "srv" / "engine.key_secret"
    client_secret = tmp_path / "allow" / "router.key_secret"  # its .key beside it is the allow-list entry
    serve = subprocess.Popen(
        _kv(
            "serve",
            "--endpoint",
            "tcp://127.0.0.1:0",
            "--rate",
            "50",
            "--duration",
            "60",
            "--curve-secret",
            str(srv_secret),
            "--curve-allow",
            str(tmp_path / "allow"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serve.stdout is not None
        started = serve.stdout.readline().split()
        live, replay = started[started.index("live") + 1], started[started.index("replay") + 1]
        tail = invoke(
            "tail",
            live,
            "--replay",
            replay,
            "--count",
            "5",
            "--duration",
            "20",
            "--curve-server-key",
            str(srv_key),
            "--curve-client-cert",
            str(client_secret),
        )
        assert tail.returncode == 0 and "Traceback" not in tail.stderr, tail.stderr
        lines = [x for x in tail.stdout.splitlines() if x.startswith("seq=")]
        assert len(lines) == 5 and lines[0].startswith("seq=0 replay"), tail.stdout
        # without the client's keys: nothing in 1 s (the publisher sends 50 batches a second)
        plain = invoke("tail", live, "--replay", replay, "--duration", "1")
        assert plain.returncode == 1 and plain.stdout.strip() == "", plain.stdout  # nothing received: exit 1
        bad = invoke("tail", live, "--curve-server-key", str(tmp_path / "nope.key"))
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such key file" in bad.stderr
    finally:
        serve.terminate()
        serve.communicate(timeout=30)


@pytest.mark.subprocess
def test_cli_serve_warns_once_on_a_plain_non_loopback_bind(tmp_path: Path) -> None:
    # two workers on 0.0.0.0, for a moment, with nothing connecting: one warning line
    r = run(
        "serve",
        "--endpoint",
        "tcp://0.0.0.0:0",
        "--replay-endpoint",
        "",
        "--workers",
        "2",
        "--duration",
        "0.2",
        "--rate",
        "5",
    )
    assert r.returncode == 0, r.stderr
    warned = [x for x in r.stderr.splitlines() if "without CURVE" in x]
    assert len(warned) == 1 and warned[0].startswith("kvevents: warning: publisher on tcp://0.0.0.0:"), r.stderr
    r = invoke("serve", "--curve-allow", str(tmp_path))
    assert r.returncode == 2 and "--curve-allow needs --curve-secret" in r.stderr


@pytest.mark.subprocess
def test_cli_record_and_doctor_with_curve(keys: dict[str, Path], tmp_path: Path) -> None:
    pub = _curve_pub(keys)
    creds = ["--curve-client-cert", str(keys["client_secret"])]
    try:
        for events in chain_events(1, 3):
            pub.publish(events)
        out = tmp_path / "c.kvlog"
        rec = invoke(
            "record",
            "--publisher",
            f"w0={pub.endpoint},{pub.replay_endpoint}",
            "-o",
            str(out),
            "--count",
            "3",
            "--duration",
            "20",
            "--curve-server-key",
            f"w0={keys['server']}",
            *creds,
        )
        assert rec.returncode == 0 and "no snapshot" not in rec.stderr, rec.stderr
        # --from snapshot asked KVE/SNAPSHOT over CURVE: the log holds its batches
        assert re.search(r"the log holds \d+ snapshot", rec.stdout), rec.stdout
        doc = invoke(
            "doctor",
            pub.endpoint,
            "--replay",
            pub.replay_endpoint or "",
            "--timeout",
            "1",
            "--json",
            "--curve-server-key",
            str(keys["server"]),
            *creds,
        )
        checks = {c["name"]: c["status"] for c in json.loads(doc.stdout)["checks"]}  # (test hashes do not recompute)
        assert {checks[k] for k in ("batches arrive and decode", "replay answers", "describe answers")} == {"ok"}, (
            checks
        )
        bad = invoke(
            "record",
            "--nats",
            "nats://127.0.0.1:1",
            "-o",
            str(tmp_path / "n.kvlog"),
            "--curve-server-key",
            str(keys["server"]),
        )
        assert bad.returncode == 2 and "apply to --publisher" in bad.stderr
    finally:
        pub.close()


def test_publishers_sharing_a_context_share_one_authenticator(keys: dict[str, Path]) -> None:
    ctx = zmq.Context()
    try:
        a = Publisher(
            endpoint=EPH,
            heartbeat_interval_s=0.02,
            context=ctx,
            curve_secret_key_file=str(keys["server_secret"]),
            curve_allow_dir=str(keys["allow"]),
        )
        b = Publisher(
            endpoint=EPH,
            heartbeat_interval_s=0.02,
            context=zmq.Context.shadow(ctx.underlying),
            curve_secret_key_file=str(keys["server_secret"]),
        )  # no allow-list: any client
        try:
            stranger = CurveClient.from_files(keys["server"], keys["other_secret"])
            assert _received(Source(a.endpoint, None, "a", curve=stranger)) == []
            assert _received(Source(b.endpoint, None, "b", curve=stranger), until=1)  # b's domain allows anyone
        finally:
            a.close()
        assert _received(Source(b.endpoint, None, "b", curve=stranger), until=1)  # b's ZAP outlives a's close
        b.close()
    finally:
        ctx.term()


@pytest.mark.subprocess
def test_cli_fetch_and_replay_with_curve(keys: dict[str, Path], tmp_path: Path) -> None:
    """`fetch` pulls a CURVE publisher's replay buffer with the client flags (and gets nothing
    without them); `replay --curve-secret` republishes it encrypted, to allowed clients only."""
    from kvevents.recordlog import read_records

    pub = _curve_pub(keys)
    creds = ["--curve-server-key", str(keys["server"]), "--curve-client-cert", str(keys["client_secret"])]
    out = tmp_path / "f.kvlog"
    try:
        for events in chain_events(1, 3):
            pub.publish(events)
        plain = invoke("fetch", pub.replay_endpoint or "", "-o", str(tmp_path / "plain.kvlog"), "--timeout", "1")
        assert plain.returncode == 2 and "no replay answer" in plain.stderr, plain.stderr  # the handshake fails
        got = invoke("fetch", pub.replay_endpoint or "", "-o", str(out), "--timeout", "5", *creds)
        assert got.returncode == 0, got.stderr
        fetched = [r.payload for r in read_records(str(out))]  # the 3 batches and the heartbeats between
        stored = [p for p in fetched if decode_batch(p).events]
        assert len(stored) == 3
        nats = invoke("fetch", "--nats", "nats://127.0.0.1:1", "-o", str(tmp_path / "n.kvlog"), *creds)
        assert nats.returncode == 2 and "not to --nats" in nats.stderr
    finally:
        pub.close()
    rep = subprocess.Popen(
        _kv(
            "replay",
            str(out),
            "--to",
            "tcp://127.0.0.1:*",
            "--replay-endpoint",
            "tcp://127.0.0.1:*",
            "--speed",
            "max",
            "--linger",
            "20",
            "--curve-secret",
            str(keys["server_secret"]),
            "--curve-allow",
            str(keys["allow"]),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert rep.stdout is not None
        first = rep.stdout.readline()  # "replaying FILE -> ENDPOINT (replay R), ..." once bound
        assert first.startswith("replaying"), first
        live, replay = first.split("-> ")[1].split()[0], first.split("(replay ")[1].split(")")[0]
        client = CurveClient.from_files(keys["server"], keys["client_secret"])
        stranger = CurveClient.from_files(keys["server"], keys["other_secret"])
        assert not any(isinstance(x, Delivery) for x in _received(Source(live, replay, "w0", curve=stranger)))
        delivered = _received(Source(live, replay, "w0", curve=client), until=len(fetched))
        assert [d.payload for d in delivered if isinstance(d, Delivery) and d.batch.events] == stored  # same bytes
    finally:
        rep.terminate()
        rep.communicate(timeout=30)
