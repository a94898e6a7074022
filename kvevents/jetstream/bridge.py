"""The bridge: engines' ZeroMQ streams (gap-repaired by a Subscriber) into one JetStream stream.

Live batches go to `kvevents.<stream>.<source>.<dp_rank>` with their payload bytes unchanged and
headers for engine seq, epoch and dp rank; `Nats-Msg-Id` is built from those and a digest of the
payload, so two bridges for one engine store each batch once. Every `snapshot_every_s` (and after
each reset the Subscriber reports) the bridge takes KVE/SNAPSHOT from the engine and stores it on
`....<dp_rank>.snap` as parts plus an end marker (with the digest of its parts), then purges the
older snapshots of that subject. With `sign_key` every message carries an HMAC of its subject,
headers and payload (`signing.SignKey`): consumers holding the key drop anything else.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from kvevents.events import rank_of
from kvevents.feed import Delivery, Reset, SourceStatus
from kvevents.jetstream.link import (
    H_EPOCH,
    H_FROM,
    H_KIND,
    H_PART,
    H_PARTS,
    H_RANK,
    H_SEQ,
    H_SNAP,
    H_SOURCE,
    LoopThread,
    NatsOptions,
    NatsUnavailable,
    StreamOptions,
    check_token,
    close,
    connect,
    ensure_stream,
    epoch_text,
    live_subject,
    retry,
    snap_subject,
)
from kvevents.jetstream.replays import ReplayTally
from kvevents.jetstream.signing import H_DIGEST, SignKey, parts_digest
from kvevents.zeromq.engine_requests import EngineRequestError
from kvevents.zeromq.engine_requests import describe as request_describe
from kvevents.zeromq.engine_requests import snapshot as request_snapshot
from kvevents.zeromq.security import client_context
from kvevents.zeromq.subscriber import Source, Subscriber

__all__ = ["Bridge", "msg_id"]

log = logging.getLogger("kvevents.bridge")

_PUBLISH_CHUNK = 512  # batches in flight per round of acks when republishing
_MAX_INFLIGHT = 2048  # live batches published and not yet acknowledged


def msg_id(source: str, rank: int, seq: int, epoch: int | None, payload: bytes) -> str:
    """Nats-Msg-Id of a live batch: equal for equal (source, rank, seq, epoch, bytes), whoever publishes.

    The payload digest keeps a restarted engine without a known epoch (same seqs again, new bytes)
    from being dropped as a duplicate of the old process's batches.
    """
    digest = hashlib.blake2b(payload, digest_size=8).hexdigest()
    return f"{source}.{rank}.{epoch_text(epoch) or 'x'}.{seq}.{digest}"


class Bridge:
    """A Subscriber per engine set, forwarding to JetStream; runs on its own threads (start/stop)."""

    def __init__(
        self,
        sources: Sequence[Source],
        stream: str,
        nats: NatsOptions,
        *,
        snapshot_every_s: float = 30.0,
        stream_options: StreamOptions | None = None,
        create_stream: bool = True,
        publish_timeout_s: float = 5.0,
        request_timeout_s: float = 2.0,
        on_unreachable: Callable[[str], object] | None = None,
        give_up_after_s: float | None = None,
        sign_key: SignKey | None = None,
        **subscriber_options: Any,
    ) -> None:
        check_token("stream", stream)
        for s in sources:
            check_token("source name", str(s.name))
        if snapshot_every_s <= 0:
            raise ValueError(f"snapshot_every_s must be > 0, got {snapshot_every_s:g}")
        self.stream = stream
        self.nats = nats
        nats.servers()  # a malformed URL is a ValueError now
        self.snapshot_every_s = snapshot_every_s
        self.stream_options = stream_options
        self.create_stream = create_stream
        self.publish_timeout_s = publish_timeout_s
        self.request_timeout_s = request_timeout_s
        self.on_unreachable = on_unreachable
        self.give_up_after_s = give_up_after_s
        self.sign_key = sign_key
        self.bridge_id = secrets.token_hex(4)
        self._sources = {str(s.name): s for s in sources}
        self._sub = Subscriber(list(sources), **subscriber_options)
        self._epochs: dict[str, int | None] = {}
        self._described_at: dict[str, float] = {}
        self._next_snap: dict[str, float] = {n: 0.0 for n, s in self._sources.items() if s.replay_endpoint}
        self._last_snap: dict[str, float] = {}
        self._snap_tasks: dict[str, asyncio.Task] = {}
        self._snap_n = 0
        self._max_ack = 0
        self._inflight: deque[tuple[asyncio.Future, tuple[str, bytes, dict[str, str]], float]] = deque()
        self._counters: Counter[str] = Counter()
        self._replays = ReplayTally()  # first-contact history is not a gap
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._lt: LoopThread | None = None
        self._poll_exec = ThreadPoolExecutor(1, thread_name_prefix="kvevents-bridge-poll")
        self._req_exec = ThreadPoolExecutor(2, thread_name_prefix="kvevents-bridge-req")
        self._nc: Any = None
        self._js: Any = None

    # ------------------------------------------------------------------ public API
    def start(self) -> Bridge:
        """Connect (retrying in the background) and forward until `stop()`."""
        if self._lt is None:
            self._lt = LoopThread("kvevents-bridge")
            self._lt.submit(self._main())
        return self

    def stop(self, timeout: float = 3.0) -> None:
        """Stop forwarding, close NATS and every socket."""
        self._stop.set()
        if self._lt is not None:
            self._done.wait(timeout)
            self._lt.stop(timeout)
            self._lt = None
        self._poll_exec.shutdown(wait=True)
        self._req_exec.shutdown(wait=False, cancel_futures=True)
        self._sub.stop()

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_connected(self, timeout: float) -> bool:
        """True once NATS answered and the stream exists."""
        return self._connected.wait(timeout)

    @property
    def error(self) -> BaseException | None:
        """Why the bridge stopped by itself (NATS given up on), or None."""
        return self._error

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def request_snapshot(self, source: str | None = None) -> None:
        """Take and store a snapshot of `source` (every source: None) as soon as possible."""
        for name in [source] if source is not None else list(self._next_snap):
            if name in self._next_snap:
                self._next_snap[name] = 0.0

    def counters(self) -> dict[str, int]:
        """The bridge's counters, the Subscriber's as `subscriber_*`, and the replayed batches told
        apart: `history_batches_replayed` (first contact, after a reset) and `gap_batches_replayed`."""
        out = {"history_batches_replayed": 0, "gap_batches_replayed": 0, **self._counters, **self._replays.counts}
        for k, v in self._sub.counters().items():
            out[f"subscriber_{k}"] = v
        return out

    def source_status(self) -> dict[str, SourceStatus]:
        """The engines' Subscriber status: what each publishes, a likely misconfiguration (kvevents.feed)."""
        return self._sub.status()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per source: next engine seq, epoch, stale, age of the newest stored snapshot (s)."""
        now = time.time()
        out = {}
        for name, st in self._sub.status().items():
            last = self._last_snap.get(name)
            out[name] = {
                "next_seq": st.next_seq,
                "epoch": self._epochs.get(name, st.epoch),
                "stale": st.stale,
                "snapshot_age_s": None if last is None else now - last,
            }
        return out

    # ------------------------------------------------------------------ the loop
    async def _main(self) -> None:
        try:
            self._nc = await connect(
                self.nats,
                on_unreachable=self.on_unreachable,
                give_up_after_s=self.give_up_after_s,
                stop=self._stop.is_set,
            )
            self._js = self._nc.jetstream(timeout=self.publish_timeout_s)
            info = await retry(
                lambda: ensure_stream(self._js, self.stream, self.stream_options, create=self.create_stream),
                f"stream {self.stream} set-up",
                stop=self._stop.is_set,
            )
            self._max_ack = int(info.state.last_seq or 0)
            self._connected.set()
            await self._forward_loop()
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported through .error; the CLI prints one line
            self._error = exc
            (log.debug if isinstance(exc, (NatsUnavailable, ValueError)) else log.warning)("bridge stopped: %s", exc)
        finally:
            for t in self._snap_tasks.values():
                t.cancel()
            if self._nc is not None:
                await close(self._nc)
            self._done.set()

    async def _forward_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            items = await loop.run_in_executor(self._poll_exec, self._sub.poll, 0.0 if self._inflight else 0.02)
            if items:
                await self._forward(items)
            await self._settle(wait=not items and bool(self._inflight))
            now = time.monotonic()
            for name, due in self._next_snap.items():
                task = self._snap_tasks.get(name)
                if now >= due and (task is None or task.done()):
                    self._next_snap[name] = now + self.snapshot_every_s
                    self._snap_tasks[name] = asyncio.create_task(self._snapshot(name))
        deadline = time.monotonic() + 2.0  # stopping: let the acks of what was sent come in
        while self._inflight and time.monotonic() < deadline:
            await self._settle(wait=True)

    async def _describe(self, name: str, timeout: float | None = None) -> dict[str, Any] | None:
        src = self._sources[name]
        if not src.replay_endpoint:
            return None
        loop = asyncio.get_running_loop()
        wait = self.request_timeout_s if timeout is None else timeout
        try:
            return await loop.run_in_executor(
                self._req_exec,
                lambda: request_describe(
                    src.replay_endpoint,  # type: ignore[arg-type]
                    timeout=wait,
                    context=client_context(src.curve),
                ),
            )
        except (EngineRequestError, OSError) as exc:
            self._counters["describe_failures"] += 1
            log.info("source %s: KVE/DESCRIBE failed: %s", name, exc)
            return None

    async def _epoch_of(self, name: str) -> int | None:
        """The engine's epoch from KVE/DESCRIBE when the Subscriber did not give one (asked at most
        every 5 s per source, briefly: forwarding waits for the answer)."""
        if name in self._epochs:
            return self._epochs[name]
        now = time.monotonic()
        if now - self._described_at.get(name, -10.0) < 5.0:
            return None
        self._described_at[name] = now
        d = await self._describe(name, timeout=min(0.5, self.request_timeout_s))
        epoch = d.get("epoch") if d else None
        if isinstance(epoch, int):
            self._epochs[name] = epoch
            return epoch
        return None

    async def _forward(self, items: list[Delivery | Reset]) -> None:
        out: list[tuple[str, bytes, dict[str, str]]] = []
        for it in items:
            if isinstance(it, Reset):
                self._counters[f"resets_{it.reason}"] += 1
                self._replays.reset(it.source, it.dp_rank)
                if out:  # what came before the reset keeps the old epoch
                    await self._send(out)
                    out = []
                self._epochs.pop(it.source, None)
                if it.epoch is not None:
                    self._epochs[it.source] = it.epoch
                self._described_at.pop(it.source, None)
                if it.source in self._next_snap:
                    self._next_snap[it.source] = 0.0  # a fresh snapshot in the stream after every reset
                continue
            if it.kind == "snapshot":  # the engine's snapshot for the Subscriber's own resync:
                self._counters["engine_snapshot_batches_skipped"] += 1  # the bridge stores its own
                continue
            rank = rank_of(it.dp_rank)
            self._replays.delivery(it.source, rank, it.kind)
            epoch = it.epoch if it.epoch is not None else await self._epoch_of(it.source)
            headers = {
                H_SOURCE: it.source,
                H_SEQ: str(it.seq),
                H_EPOCH: epoch_text(epoch),
                H_RANK: str(rank),
                H_KIND: "live",
                "Nats-Msg-Id": msg_id(it.source, rank, it.seq, epoch, it.payload),
            }
            out.append(self._signed(live_subject(self.stream, it.source, rank), it.payload, headers))
        if out:
            await self._send(out)

    def _signed(self, subject: str, payload: bytes, headers: dict[str, str]) -> tuple[str, bytes, dict[str, str]]:
        if self.sign_key is not None:
            self.sign_key.sign(subject, headers, payload)
        return subject, payload, headers

    async def _send(self, msgs: list[tuple[str, bytes, dict[str, str]]]) -> None:
        """Publish live batches without waiting for their acks (`_settle` checks them, in order)."""
        for m in msgs:
            if len(self._inflight) >= _MAX_INFLIGHT:
                await self._settle(wait=True)
            subject, payload, headers = m
            try:
                fut = await self._js.publish_async(subject, payload, headers=dict(headers))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - NATS away: this and the rest go the slow, sure way
                self._note_publish_failure("live", exc, 0)
                rest = [x for _, x, _ in self._inflight] + msgs[msgs.index(m) :]
                self._drop_inflight()
                await self._publish_all(rest)
                return
            self._inflight.append((fut, m, time.monotonic()))

    def _drop_inflight(self) -> None:
        for fut, _, _ in self._inflight:
            if not fut.done():
                fut.cancel()
        self._inflight.clear()

    async def _settle(self, wait: bool) -> None:
        """Count the acks that came, in order; a failed or overdue one republishes the rest in order.

        Republishing what may be stored already is safe: Nats-Msg-Id drops it (and consumers
        order by engine seq anyway).
        """
        q = self._inflight
        if wait and q and not q[0][0].done():
            try:
                await asyncio.wait_for(
                    asyncio.shield(q[0][0]), min(0.02, max(0.0, q[0][2] + self.publish_timeout_s - time.monotonic()))
                )
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - judged below
                pass
        now = time.monotonic()
        while q:
            fut, _, sent = q[0]
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                ack = fut.result()
                self._max_ack = max(self._max_ack, ack.seq)
                self._counters["duplicates_dropped" if ack.duplicate else "live_published"] += 1
                q.popleft()
                continue
            if fut.done() or now - sent >= self.publish_timeout_s:
                exc = fut.exception() if fut.done() and not fut.cancelled() else TimeoutError("no ack in time")
                self._note_publish_failure("live", exc or TimeoutError("cancelled"), 0)
                rest = [m for _, m, _ in q]
                self._drop_inflight()
                await self._publish_all(rest)
            return

    async def _publish_all(self, msgs: list[tuple[str, bytes, dict[str, str]]], what: str = "live") -> list[int]:
        """Publish in order, pipelined, until every message is acknowledged; the stream seqs acked.

        A failed round is retried from the first unacknowledged message (Nats-Msg-Id drops what
        was stored already), with backoff, for as long as it takes: nothing is skipped.
        """
        acked: list[int] = []
        delay = 0.1
        failures = 0
        i = 0
        while i < len(msgs):
            chunk = msgs[i : i + _PUBLISH_CHUNK]
            futs: list[asyncio.Future] = []
            try:
                for subject, payload, headers in chunk:
                    futs.append(await self._js.publish_async(subject, payload, headers=dict(headers)))
                await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), self.publish_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - NATS away or slow: retry below
                self._note_publish_failure(what, exc, failures)
            ok = 0
            for f in futs:
                if not f.done() or f.cancelled() or f.exception() is not None:
                    break
                ack = f.result()
                acked.append(ack.seq)
                self._max_ack = max(self._max_ack, ack.seq)
                self._counters["duplicates_dropped" if ack.duplicate else f"{what}_published"] += 1
                ok += 1
            for f in futs[ok:]:
                if not f.done():
                    f.cancel()
            i += ok
            if ok < len(chunk):
                if self._stop.is_set():
                    raise asyncio.CancelledError
                failures += 1
                bad = next((f for f in futs[ok:] if f.done() and not f.cancelled() and f.exception()), None)
                if bad is not None:  # an error answer (a send that raised was noted above)
                    self._note_publish_failure(what, bad.exception(), failures)  # type: ignore[arg-type]
                self._counters["publish_retries"] += 1
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
            else:
                delay, failures = 0.1, 0
        return acked

    def _note_publish_failure(self, what: str, exc: BaseException, failures: int) -> None:
        self._counters["publish_failures"] += 1
        if failures == 0 or failures % 20 == 0:
            log.warning("publishing %s batches to JetStream failed (%s: %s); retrying", what, type(exc).__name__, exc)

    # ------------------------------------------------------------------ snapshots
    async def _snapshot(self, name: str) -> None:
        """KVE/SNAPSHOT from the engine into the stream: parts, end marker, then older ones purged."""
        src = self._sources[name]
        loop = asyncio.get_running_loop()
        try:
            info = await self._js.stream_info(self.stream)
            start = max(int(info.state.last_seq or 0), self._max_ack) + 1  # S+1 is stored after this
            before = await self._describe(name)
            payloads, covered = await loop.run_in_executor(
                self._req_exec,
                lambda: request_snapshot(
                    src.replay_endpoint,  # type: ignore[arg-type]
                    timeout=self.request_timeout_s,
                    context=client_context(src.curve),
                ),
            )
            after = await self._describe(name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - engine or NATS away: try again sooner
            return self._snapshot_failed(name, f"{type(exc).__name__}: {exc}")
        if before is None or after is None or before.get("epoch") != after.get("epoch"):
            return self._snapshot_failed(name, "the engine restarted (or stopped answering) during the snapshot")
        epoch = before.get("epoch") if isinstance(before.get("epoch"), int) else None
        rank = rank_of(before.get("dp_rank"))
        self._snap_n += 1
        sid = f"{self.bridge_id}-{self._snap_n}"
        base = {
            H_SOURCE: name,
            H_SEQ: str(-1 if covered is None else covered),
            H_EPOCH: epoch_text(epoch),
            H_RANK: str(rank),
            H_SNAP: sid,
            H_FROM: str(start),
        }
        subject = snap_subject(self.stream, name, rank)
        msgs = [self._signed(subject, p, {**base, H_KIND: "part", H_PART: str(i)}) for i, p in enumerate(payloads)]
        end = {**base, H_KIND: "end", H_PARTS: str(len(payloads)), H_DIGEST: parts_digest(payloads)}
        msgs.append(self._signed(subject, b"", end))
        try:
            acked = await self._publish_all(msgs, "snapshot")
            await retry(
                lambda: self._js.purge_stream(self.stream, subject=subject, seq=acked[0]),
                f"purging older snapshots of {subject}",
                attempts=5,
                stop=self._stop.is_set,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the snapshot is stored; an old one lingers until max age
            log.info("source %s: older snapshots not purged: %s", name, exc)
        self._counters["snapshots_stored"] += 1
        self._last_snap[name] = time.time()

    def _snapshot_failed(self, name: str, why: str) -> None:
        self._counters["snapshot_failures"] += 1
        self._next_snap[name] = min(self._next_snap.get(name, 0.0), time.monotonic() + min(self.snapshot_every_s, 2.0))
        log.info("source %s: snapshot not taken (%s); retrying", name, why)
