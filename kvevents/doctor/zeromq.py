"""`kvevents doctor`: diagnose "my events don't arrive" against a live publisher, check by check.

Talks the wire protocol directly (SUB on "", DEALER for replay / KVE/SNAPSHOT / KVE/DESCRIBE)
instead of through the Subscriber, so it can see what the Subscriber would hide (other topics,
malformed frames, seq holes). Every failed check carries a concrete hint.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import zmq

from kvevents import native
from kvevents.doctor.hashes import PROFILES, hash_check
from kvevents.doctor.wiring import probe_wiring
from kvevents.errors import DecodeError
from kvevents.events import KVEventBatch, decode_batch
from kvevents.zeromq.engine_requests import EngineRequestError, NotOffered, replay_replies
from kvevents.zeromq.engine_requests import describe as describe_request
from kvevents.zeromq.engine_requests import replay as replay_request
from kvevents.zeromq.framing import framing_label
from kvevents.zeromq.wire import SEQ

__all__ = ["Check", "DoctorReport", "run_doctor", "fetch_replay", "request_describe", "ProbeError"]

OK, FAIL, WARN, SKIP = "ok", "fail", "warn", "skip"


ProbeError = EngineRequestError  # a replay/describe request got no (valid) answer in time
fetch_replay = replay_request  # the doctor's names for kvevents.zeromq.engine_requests
request_describe = describe_request


@dataclass
class Check:
    """One checklist line: status is ok | fail | warn | skip; a failed or warned check has a hint."""

    name: str
    status: str
    detail: str = ""
    hint: str = ""

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass
class DoctorReport:
    endpoint: str
    replay: str | None
    checks: list[Check] = field(default_factory=list)
    seen: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def add(self, name: str, status: str, detail: str = "", hint: str = "") -> Check:
        c = Check(name, status, detail, hint)
        self.checks.append(c)
        return c

    def as_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "replay": self.replay,
            "ok": self.ok,
            "checks": [c.as_dict() for c in self.checks],
            "seen": self.seen,
        }


# ---------------------------------------------------------------- raw probes

_TCP = re.compile(r"^tcp://(\[[^\]]+\]|[^:/]+):(\d+)$")


def _probe_address(endpoint: str, timeout: float) -> tuple[str, str, str]:
    """(status, detail, hint) for: does something listen at `endpoint`?"""
    if endpoint.startswith("ipc://"):
        import os

        path = endpoint[len("ipc://") :]
        if os.path.exists(path):
            return OK, f"ipc socket {path} exists", ""
        return (
            FAIL,
            f"ipc socket {path} does not exist",
            (
                "start the engine with this ipc endpoint, or check the path (ipc paths are relative to the "
                "publisher's working directory)"
            ),
        )
    m = _TCP.match(endpoint)
    if m is None:
        return (
            FAIL,
            f"{endpoint!r} is not a tcp://HOST:PORT or ipc:// endpoint",
            (
                "use the address the publisher binds, e.g. tcp://127.0.0.1:5557 (a wildcard like tcp://*:5557 "
                "is a bind address: connect to the host's real address)"
            ),
        )
    host, port = m.group(1).strip("[]"), int(m.group(2))
    if host in ("*", "0.0.0.0", "::"):
        return FAIL, f"{endpoint} is a wildcard bind address", f"connect to a real address, e.g. tcp://127.0.0.1:{port}"
    try:
        with socket.create_connection((host, port), timeout=min(timeout, 2.0)):
            pass
    except OSError as exc:
        return (
            FAIL,
            f"nothing accepts TCP connections at {host}:{port} ({exc.strerror or exc})",
            (
                f"is the engine running with KV events enabled and its publisher bound to port {port}? "
                f'(SGLang/vLLM: --kv-events-config \'{{"publisher":"zmq","endpoint":"tcp://*:{port}"}}\'); '
                f"if the publisher connects instead of binding (bind=false), run a consumer that binds"
            ),
        )
    return OK, f"{host}:{port} accepts connections", ""


# ---------------------------------------------------------------- the checklist


@dataclass
class _Seen:
    messages: int = 0
    malformed: int = 0
    decoded: int = 0
    decode_errors: list[str] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)
    heartbeats: int = 0
    gaps: int = 0
    missing: int = 0
    backwards: int = 0
    epochs: set = field(default_factory=set)
    max_silence: float = 0.0
    live: dict[int, bytes] = field(default_factory=dict)  # seq -> payload (first 2000)
    batches: list[tuple[int | None, KVEventBatch, bytes]] = field(default_factory=list)
    newest: int | None = None
    oldest: int | None = None


def _listen(endpoint: str, duration: float, ctx: zmq.Context) -> _Seen:
    seen = _Seen()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    last_seq: dict[Any, int] = {}
    t_start = time.monotonic()
    t_last = t_start
    try:
        deadline = t_start + duration
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sub.poll(int(left * 1000)):
                break
            frames = sub.recv_multipart()
            now = time.monotonic()
            seen.max_silence = max(seen.max_silence, now - t_last)
            t_last = now
            seen.messages += 1
            if len(frames) != 3 or len(frames[1]) != 8:
                seen.malformed += 1
                continue
            topic = frames[0].decode("utf-8", "replace")
            seen.topics[topic] = seen.topics.get(topic, 0) + 1
            seq = SEQ.unpack(frames[1])[0]
            try:
                batch = decode_batch(frames[2])
            except DecodeError as exc:
                if len(seen.decode_errors) < 5:
                    seen.decode_errors.append(f"seq {seq}: {exc}")
                continue
            seen.decoded += 1
            if not batch.events:
                seen.heartbeats += 1
            if batch.epoch is not None:
                seen.epochs.add(batch.epoch)
            key = (topic, batch.data_parallel_rank)
            prev = last_seq.get(key)
            if prev is not None:
                if seq > prev + 1:
                    seen.gaps += 1
                    seen.missing += seq - prev - 1
                elif seq <= prev:
                    seen.backwards += 1
            last_seq[key] = seq
            seen.oldest = seq if seen.oldest is None else min(seen.oldest, seq)
            seen.newest = seq if seen.newest is None else max(seen.newest, seq)
            if len(seen.live) < 2000:
                seen.live[seq] = frames[2]
            if len(seen.batches) < 20000:
                seen.batches.append((seq, batch, frames[2]))
        seen.max_silence = max(seen.max_silence, time.monotonic() - t_last)
    finally:
        sub.close(0)
    return seen


def run_doctor(
    endpoint: str,
    *,
    replay: str | None = None,
    page_size: int | None = None,
    topic: str | None = None,
    timeout: float = 3.0,
    salts: Iterable[str] = (),
    context: zmq.Context | None = None,
    profile: str | None = None,
) -> DoctorReport:
    """Run every check against `endpoint` (and `replay`); never raises for what it finds.
    `profile`: the hash profile to recompute published hashes under (kvevents.doctor.hashes; None:
    detected from the stream)."""

    if timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")
    if page_size is not None and page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if profile is not None and profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    ctx = context or zmq.Context.instance()
    rep = DoctorReport(endpoint, replay)
    rep.add("hashing path", OK, native.describe())  # compiled fast path or the pure-Python twin
    status, detail, hint = _probe_address(endpoint, timeout)
    rep.add("address answers", status, detail, hint)
    later = ["sockets and keys", "topic matches", "batches arrive and decode", "seqs continuous", "heartbeats come"]
    wiring = None
    if status == FAIL:
        for name in later:
            rep.add(name, SKIP, "address does not answer")
        seen = _Seen()
    else:
        wiring = probe_wiring(endpoint, replay, ctx, min(timeout, 1.5))  # a PUB and a ROUTER, keys that fit
        wiring.add_check(rep, endpoint, replay)
        seen = _listen(endpoint, timeout, ctx)
        _live_checks(rep, seen, topic, timeout)
    rep.seen = {
        "messages": seen.messages,
        "topics": seen.topics,
        "heartbeats": seen.heartbeats,
        "epochs": sorted(seen.epochs),
        "newest_seq": seen.newest,
        "gaps": seen.gaps,
    }
    described = _replay_checks(rep, seen, replay, timeout, ctx)
    if page_size is None and described and isinstance(described.get("page_size"), int) and described["page_size"] > 0:
        page_size = described["page_size"]
    hash_check(rep, seen, replay, page_size, list(salts), timeout, ctx, profile)
    if wiring is not None:
        wiring.explain(rep)  # the likely cause, named in the hints of the checks it fails
    return rep


def _live_checks(rep: DoctorReport, seen: _Seen, topic: str | None, timeout: float) -> None:
    """The checks on what the SUB socket heard: topic, decoding, seq continuity, heartbeats, in that order."""
    _topic_check(rep, seen, topic)
    _decode_check(rep, seen, timeout)
    _seq_check(rep, seen)
    _heartbeat_check(rep, seen)


def _topic_check(rep: DoctorReport, seen: _Seen, topic: str | None) -> None:
    """Check "topic matches": the consumer's --topic prefix against the topics the publisher really sends."""
    topics = ", ".join(f"{t!r} ({n})" for t, n in seen.topics.items()) or "none"
    if not seen.messages:
        rep.add("topic matches", SKIP, "no message received")
    elif topic is None:
        rep.add("topic matches", OK, f"topics seen: {topics} (no --topic given: subscribe to one of these)")
    else:
        match = {t: n for t, n in seen.topics.items() if t.startswith(topic)}
        if not match:
            seen_t = next(iter(seen.topics), "")
            rep.add(
                "topic matches",
                FAIL,
                f"subscribed to {topic!r} but the publisher sends {topics}",
                f"use topic {seen_t!r} in the consumer (--topic {seen_t!r}), or set the publisher's topic to "
                f'{topic!r}; ZeroMQ topics are byte prefixes and the default is "" (everything)',
            )
        elif any(t != topic for t in match):
            rep.add(
                "topic matches",
                WARN,
                f"prefix {topic!r} also matches {', '.join(repr(t) for t in match)}",
                "ZeroMQ subscribes by prefix: use distinct topics per publisher if you filter by topic",
            )
        else:
            rep.add("topic matches", OK, f"topic {topic!r} ({match[topic]} messages)")


def _decode_check(rep: DoctorReport, seen: _Seen, timeout: float) -> None:
    """Check "batches arrive and decode": something arrived within `timeout`, all of it well-framed KVEventBatches."""
    if not seen.messages:
        rep.add(
            "batches arrive and decode",
            FAIL,
            f"connected, but no message arrived in {timeout:g}s",
            "the publisher is idle with heartbeats off, or this is not the live (PUB) port (the replay port "
            "is usually live port + 1), or the engine publishes nothing: enable kv events in the engine, set "
            "heartbeat_interval_s > 0, and run doctor with a longer --timeout",
        )
    elif seen.malformed or seen.decode_errors or not seen.decoded:
        rep.add(
            "batches arrive and decode",
            FAIL,
            f"{seen.messages} messages, {seen.malformed} not [topic, seq(8 bytes), payload], "
            f"{len(seen.decode_errors)}+ undecodable: {'; '.join(seen.decode_errors[:2])}",
            "the payload is not a KVEventBatch [ts, events, dp_rank]: is this a vLLM/SGLang KV events "
            "publisher (not another ZeroMQ service on this port)? check event encoding and versions",
        )
    else:
        rep.add("batches arrive and decode", OK, f"{seen.decoded} batches decoded ({seen.heartbeats} heartbeats)")


def _seq_check(rep: DoctorReport, seen: _Seen) -> None:
    """Check "seqs continuous": holes or backward steps per (topic, rank) mean lost batches or a restart."""
    if seen.decoded < 2:
        rep.add("seqs continuous", SKIP, "fewer than 2 batches seen")
    elif seen.gaps or seen.backwards:
        rep.add(
            "seqs continuous",
            FAIL,
            f"{seen.gaps} gaps ({seen.missing} seqs missing), {seen.backwards} backwards steps",
            "batches are lost between publisher and consumer (high-water mark drops, a full publisher "
            "queue) or the publisher restarted: give the publisher a replay_endpoint so consumers repair "
            "gaps, raise hwm, and check dropped counters on the publisher",
        )
    else:
        rep.add("seqs continuous", OK, f"seqs {seen.oldest}..{seen.newest} without a hole")


def _heartbeat_check(rep: DoctorReport, seen: _Seen) -> None:
    """Check "heartbeats come": an idle stream must heartbeat, or consumers cannot tell idle from dead."""
    if not seen.decoded:
        rep.add("heartbeats come", SKIP, "no batch seen")
    elif seen.heartbeats:
        rep.add("heartbeats come", OK, f"{seen.heartbeats} heartbeats, longest silence {seen.max_silence:.2f}s")
    elif seen.max_silence < 1.5:
        rep.add("heartbeats come", OK, f"busy stream (longest silence {seen.max_silence:.2f}s): no heartbeat needed")
    else:
        rep.add(
            "heartbeats come",
            WARN,
            f"silences up to {seen.max_silence:.2f}s without a heartbeat",
            "without heartbeats a consumer cannot tell an idle publisher from a dead one or detect tail "
            "loss: set heartbeat_interval_s (kvevents publisher, default 1.0)",
        )


def _replay_checks(rep: DoctorReport, seen: _Seen, replay: str | None, timeout: float, ctx: zmq.Context) -> dict | None:
    """Checks "replay answers" and "describe answers" (both skipped without `replay`); the DESCRIBE answer or None."""
    if not replay:
        rep.add(
            "replay answers",
            SKIP,
            "no --replay endpoint given",
            "without a replay endpoint consumers cannot repair gaps",
        )
        rep.add("describe answers", SKIP, "no --replay endpoint given")
        return None
    _replay_check(rep, seen, replay, timeout, ctx)
    return _describe_check(rep, seen, replay, timeout, ctx)


def _replay_check(rep: DoctorReport, seen: _Seen, replay: str, timeout: float, ctx: zmq.Context) -> None:
    """Check "replay answers": replay from the newest live seq, then judge the replies against the live bytes."""
    start = seen.newest if seen.newest is not None else 0
    framings: list[str] = []  # of each reply, in order (zeromq.framing)
    try:
        got = []
        for r in replay_replies(replay, start, timeout=min(timeout, 3.0), context=ctx):
            framings.append(r.framing)
            if not r.is_end:
                got.append((r.topic, SEQ.unpack(r.seq)[0], r.payload))
    except ProbeError as exc:
        port = _TCP.match(replay)
        rep.add(
            "replay answers",
            FAIL,
            str(exc),
            "is the publisher started with replay_endpoint set to this address (a ROUTER, often live port + 1)"
            + (f"? is something listening on port {port.group(2)}?" if port else "?"),
        )
        return
    _judge_replay(rep, seen, start, got, framings)
    rep.seen["replay_framing"] = framings[-1]


def _judge_replay(
    rep: DoctorReport, seen: _Seen, start: int, got: list[tuple[bytes | None, int, bytes]], framings: list[str]
) -> None:
    """The "replay answers" verdict: same bytes as live, starting where asked, in one framing."""
    mism = [s for _, s, p in got if s in seen.live and seen.live[s] != p]
    if mism:
        rep.add(
            "replay answers",
            FAIL,
            f"replayed bytes differ from live bytes at seqs {mism[:5]}",
            "the replay ring must keep exactly the bytes sent live (schemas/README.md, Transport)",
        )
    elif got and got[0][1] > start and seen.newest is not None:
        rep.add(
            "replay answers",
            WARN,
            f"asked from seq {start}, first reply is seq {got[0][1]}",
            "the ring no longer holds the newest seq seen live: is buffer_steps tiny?",
        )
    elif len(set(framings)) > 1:
        rep.add(
            "replay answers",
            WARN,
            f"replies mix the replay framings {sorted(set(framings))}",
            "consumers read each reply on its own, but one publisher should use one framing",
        )
    else:
        rep.add(
            "replay answers",
            OK,
            f"replay from seq {start}: {len(got)} batches then the end marker; framing {framing_label(framings[-1])}",
        )


def _describe_check(rep: DoctorReport, seen: _Seen, replay: str, timeout: float, ctx: zmq.Context) -> dict | None:
    """Check "describe answers": KVE/DESCRIBE must name the live epoch and topic; the answer, or None without one."""
    try:
        d = request_describe(replay, timeout=min(timeout, 2.0), context=ctx)
    except NotOffered as exc:
        rep.add("describe answers", SKIP, f"not offered: {exc}")
        return None
    except ProbeError as exc:
        rep.add(
            "describe answers",
            WARN,
            str(exc),
            "KVE/DESCRIBE is a kvevents extension: stock vLLM/SGLang publishers do not answer it (fine); "
            "a kvevents publisher always does, so check the replay address",
        )
        return None
    detail = ", ".join(f"{k}={d.get(k)!r}" for k in ("epoch", "topic", "page_size", "dp_rank", "newest_seq"))
    if seen.epochs and d.get("epoch") is not None and d.get("epoch") not in seen.epochs:
        rep.add(
            "describe answers",
            FAIL,
            f"describe epoch {d.get('epoch')} is not the live epoch(s) {sorted(seen.epochs)}",
            "the replay endpoint belongs to another publisher (or rank)",
        )
    elif seen.topics and d.get("topic") not in seen.topics:
        rep.add(
            "describe answers",
            WARN,
            f"describe says topic {d.get('topic')!r}, live topics are {sorted(seen.topics)}",
            "the replay endpoint may belong to another publisher: pair each live endpoint with its own replay endpoint",
        )
    else:
        rep.add("describe answers", OK, detail)
    rep.seen["describe"] = d
    return d
