"""ZeroMQ publisher of KV-cache event batches, wire-compatible with vLLM >= 0.26 (schemas/README.md,
"Wire format" and "Transport in one page").

`publish()` encodes and sends on the caller's thread under a lock (a PUB send never blocks; see
benchmarks/bench_publisher.py for why this beats a queue + sender thread). A service thread answers
replay / KVE/SNAPSHOT / KVE/DESCRIBE on the ROUTER in slices and sends heartbeats when idle
(`PublisherConfig.snapshots=False` turns KVE/SNAPSHOT and its per-publish cost off).
Each publisher owns its zmq.Context (unless given one), so `close()` returns with its ports free:
the sockets are publisher_sockets.py's, the service thread's loop publisher_service.py's.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections import deque
from typing import Any, Literal, Protocol, Sequence

import msgspec
import zmq

from kvevents.events import BatchEncoder, BlockStored, Event, decode_batch
from kvevents.zeromq import security
from kvevents.zeromq.publisher_config import PublisherConfig
from kvevents.zeromq.publisher_service import ServiceLoop
from kvevents.zeromq.publisher_sockets import PLAIN_BIND_WARNING as PLAIN_BIND_WARNING
from kvevents.zeromq.publisher_sockets import PublisherSockets
from kvevents.zeromq.replay_server import ReplayServer
from kvevents.zeromq.view import FrozenView, LiveView
from kvevents.zeromq.wire import HASH_SCHEME, SCHEMA_VERSION, pack_seq

__all__ = ["Publisher", "PublisherConfig", "publish_steps"]

log = logging.getLogger("kvevents.zeromq.publisher")

_STRICT_BATCH = b"\x93"  # msgpack fixarray of 3: [ts, events, rank]
_MORE = int(zmq.SNDMORE) | int(zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)


class EventSource(Protocol):
    def take_events(self) -> list[Event]: ...


_STAT_KEYS = (
    "events_published",
    "dropped_queue_full",
    "dropped_live",
    "send_errors",
    "encode_errors",
    "bytes_sent",
    "payloads_republished",
)
_SVC_KEYS = (
    "heartbeats",
    "replay_requests",
    "replays_served",
    "replay_batches_sent",
    "snapshot_requests",
    "snapshots_served",
    "snapshot_batches_sent",
    "describe_requests",
    "rejected_requests",
    "replies_abandoned",
    "bytes_sent",
    "rejected_peer_cap",  # transport.replay_server.ROUTER_COUNTERS
    "rejected_oversized",
    "jobs_expired",
    "rejected_describe_rate",
)


class Publisher:
    """Publishes batches with seq + epoch; keeps a replay ring and, with a replay endpoint and
    unless `snapshots=False`, a live-block view for snapshots.

    `send_mode="caller"` (default) sends on the calling thread; `"queue"` hands batches to a
    sender thread through a bounded queue (a full queue drops the batch, counted, seq consumed).
    """

    def __init__(
        self,
        config: PublisherConfig | None = None,
        *,
        send_mode: Literal["caller", "queue"] = "caller",
        context: zmq.Context | None = None,
        **overrides: Any,
    ) -> None:
        config = PublisherConfig(**overrides) if config is None else config.with_overrides(overrides)
        if send_mode not in ("caller", "queue"):
            raise ValueError(f"send_mode must be 'caller' or 'queue', got {send_mode!r}")
        self.config = config
        self.send_mode = send_mode
        self._init_state(config)
        curve = None
        if config.curve_secret_key_file is not None:  # a bad key file is a ValueError before any socket
            curve = security.CurveServer.from_files(config.curve_secret_key_file, config.curve_allow_dir)
        self._sockets = sockets = PublisherSockets(config, context, curve)
        self.endpoint: str = sockets.endpoint
        self.replay_endpoint: str | None = sockets.replay_endpoint
        self._send = sockets.send  # the compiled send, an attribute: _emit's three calls
        if curve is None:
            sockets.warn_if_exposed()
        router = sockets.router
        # snapshots are only served over the ROUTER; without them the (empty) view only holds the
        # page size DESCRIBE reports, learned from the first BlockStored (_learn_page)
        self._keep_view = router is not None and config.snapshots
        self._learn_page = router is not None and not config.snapshots
        self._service = ReplayServer(self, router) if router is not None else None
        self._start_threads(send_mode, config.max_queue_size)
        if config.metrics_port is not None:
            self._serve_metrics(config.metrics_port)

    def _init_state(self, config: PublisherConfig) -> None:
        """Stream identity, encoders, the replay ring, the live view and the counters."""
        self._epoch: int = secrets.randbits(63) if config.epoch is None else config.epoch
        self._topic_b = config.topic.encode()
        self._rank = config.dp_rank
        # (rank, epoch element) the stream's batches carry: ours, or the last republished payload's
        # (publish_payload), so heartbeats and snapshots never look like another stream or a restart
        # to consumers. The epoch element is None (left out) unless epoch_in_batch; the stream's epoch
        # (what KVE/DESCRIBE reports) is kept apart. Both change only under the lock.
        self._own_id: tuple[int | None, int | None] = (config.dp_rank, self._epoch if config.epoch_in_batch else None)
        self._stream_id: tuple[int | None, int | None] = self._own_id
        self._stream_epoch: int | None = self._epoch
        self._enc = BatchEncoder(config.event_encoding)
        # map encoding: msgspec directly on the (ts, events, rank, epoch) tuple, the bytes BatchEncoder writes
        self._fast_encode = msgspec.msgpack.Encoder().encode_into if config.event_encoding == "map" else None
        self._scratch = bytearray(4096)  # encode_into target (under the lock): no realloc chain per batch
        self._lock = threading.Lock()
        self._seq = 0
        self._ring: deque[tuple[int, bytes, bytes]] = deque(maxlen=config.buffer_steps)
        self._view = LiveView()
        self._stats = dict.fromkeys(_STAT_KEYS, 0)  # rare counters; the hot ones are attributes
        self._n_events = 0
        self._n_bytes = 0
        self._svc_stats = dict.fromkeys(_SVC_KEYS, 0)
        self._drop_live = 0
        self._force_drop = 0
        self._closed = False
        self._metrics_port: int | None = None  # the port serving /metrics (config's, or the free one for 0)
        # queue mode: batches enqueued and not yet emitted or lost (under the lock), and the flag
        # close() sets under the lock so that the sender never touches a socket close() closes
        self._pending = 0
        self._abandoned = False
        self._stop = threading.Event()
        self._queue: queue.Queue | None = None
        self._sender: threading.Thread | None = None

    def _start_threads(self, send_mode: str, max_queue_size: int) -> None:
        """The service thread (replay server, heartbeats) and, in queue mode, the sender."""
        if send_mode == "queue":
            self._queue = queue.Queue(maxsize=max_queue_size)
            self._sender = threading.Thread(target=self._send_loop, name="kvevents-pub-sender", daemon=True)
            self._sender.start()
        loop = ServiceLoop(
            next_seq=self._next_seq,
            heartbeat=self._heartbeat,
            heartbeat_s=self.config.heartbeat_interval_s,
            heartbeat_before_first=self.config.heartbeat_before_first,
            server=self._service,
            router=self._sockets.router,
            stop=self._stop,
        )
        self._thread = threading.Thread(target=loop.run, name="kvevents-pub-service", daemon=True)
        self._thread.start()

    def _serve_metrics(self, port: int) -> None:
        from kvevents.zeromq import metrics

        try:
            self._metrics_port = metrics.serve_publisher(self, port)
        except (OSError, ValueError) as exc:  # a busy port: release the thread and both ports first
            self.close(0)
            raise ValueError(f"metrics port {port}: {exc}") from None

    # ------------------------------------------------------------------ public API
    @property
    def epoch(self) -> int:
        """This publisher's epoch (PublisherConfig.epoch, or random); fixed for its lifetime."""
        return self._epoch

    @property
    def metrics_port(self) -> int | None:
        """The port serving /metrics: PublisherConfig.metrics_port, or the free one it picked for 0."""
        return self._metrics_port

    def publish(self, events: Sequence[Event], ts: float | None = None) -> int:
        """Publish one batch (one engine step); returns its seq. Never waits on a consumer.

        Any thread may call it. The events are kept by reference for snapshots: do not mutate them
        after publishing (RadixCache.take_events() hands over fresh lists).
        """
        return self._publish(events, time.time() if ts is None else ts, None, self._own_id, self._epoch)

    def publish_payload(self, payload: bytes) -> int:
        """Republish an already-encoded payload under a new seq (the view, if kept, is updated from it).

        The payload's bytes go out unchanged, except that without `epoch_in_batch` a payload of more
        than 3 elements is re-encoded as [ts, events, rank]: the default wire stays strict.
        """
        batch = decode_batch(payload)  # DecodeError (a ValueError) before anything changes
        rank, epoch = batch.data_parallel_rank, batch.epoch
        stream_epoch = self._epoch if epoch is None else epoch
        ids: tuple[int | None, int | None]
        raw: bytes | None
        if self.config.epoch_in_batch:
            ids = (rank, stream_epoch)
            raw = bytes(payload)
        else:
            ids = (rank, None)
            raw = bytes(payload) if payload[:1] == _STRICT_BATCH else None
        seq = self._publish(batch.events, batch.ts, raw, ids, stream_epoch)
        with self._lock:
            self._stats["payloads_republished"] += 1
        return seq

    def drop_live(self, n: int) -> None:
        """Test hook: the next n batches are not sent live (seq consumed, kept for replay)."""
        with self._lock:
            self._drop_live += max(0, int(n))

    def force_drop(self, n: int) -> None:
        """Test hook: the next n batches are dropped as if the queue were full (not replayable)."""
        with self._lock:
            self._force_drop += max(0, int(n))

    def stats(self) -> dict[str, int]:
        """Counters (plus next_seq, queue_depth, ring_size, live_blocks) as plain ints."""
        out = dict(self._stats)
        out["events_published"] = self._n_events
        out["bytes_sent"] += self._n_bytes
        for k, v in self._svc_stats.items():
            out[k] = out.get(k, 0) + v
        out["curve_denied"] = self._sockets.curve_denied()
        out["batches_published"] = out["next_seq"] = self._seq
        out["queue_depth"] = self._queue.qsize() if self._queue is not None else 0
        with self._lock:
            out["ring_size"] = len(self._ring)
            out["live_blocks"] = len(self._view)
        return out

    def describe(self) -> dict[str, Any]:
        """What a KVE/DESCRIBE request answers: one map, None where nothing is known yet (page_size
        is learned only when a replay endpoint is set). Consumers read `epoch` here to find restarts."""
        newest, oldest = self.seq_range()
        with self._lock:
            epoch = self._stream_epoch
        return {
            "schema_version": SCHEMA_VERSION,
            "hash_scheme": HASH_SCHEME,
            "page_size": self._view.page_size,
            "epoch": epoch,
            "topic": self.config.topic,
            "dp_rank": self.config.dp_rank,
            "newest_seq": newest,
            "oldest_replayable_seq": oldest,
            "event_encoding": self.config.event_encoding,
            "epoch_in_batch": self.config.epoch_in_batch,
        }

    # ------------------------------------------------------------------ the replay server's seam
    @property
    def topic_bytes(self) -> bytes:
        """The topic frame of every message."""
        return self._topic_b

    def batch_ids(self) -> tuple[int | None, int | None]:
        """(rank, epoch element) that batches of the current stream carry (epoch None: left out)."""
        with self._lock:
            return self._stream_id

    def ring_items(self) -> list[tuple[int, bytes, bytes]]:
        """A copy of the replay ring: (seq, 8-byte seq frame, payload), oldest first."""
        with self._lock:
            return list(self._ring)

    def freeze_view(self) -> tuple[FrozenView, int]:
        """The live-block view and the newest seq it reflects (-1 before the first batch)."""
        with self._lock:
            return self._view.freeze(), self._seq - 1

    def seq_range(self) -> tuple[int | None, int | None]:
        """(newest published seq, oldest replayable seq); None where there is none."""
        with self._lock:
            newest = self._seq - 1 if self._seq else None
            oldest = self._ring[0][0] if self._ring else None
            return newest, oldest

    def count(self, key: str, n: int = 1) -> None:
        """Add to a service counter (the replay server's thread is the only writer)."""
        self._svc_stats[key] += n

    def close(self, timeout: float = 1.0) -> int:
        """Flush pending batches for up to `timeout` s, stop, close; returns unsent batches (queue mode).

        Returns once the sockets are really closed (the owned context is terminated): the
        endpoints can be bound again at once.
        """
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
        deadline = time.monotonic() + max(0.0, timeout)
        if self._queue is not None:
            while self._pending and time.monotonic() < deadline:
                time.sleep(0.001)
        self._stop.set()
        with self._lock:  # from here on the sender drops what it holds instead of sending it
            self._abandoned = True
            unsent, self._pending = self._pending, 0
        if self._queue is not None:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
        if self._sender is not None:
            self._sender.join(max(0.05, deadline - time.monotonic()))
        self._thread.join(max(0.05, deadline - time.monotonic()) + 1.0)
        if unsent:
            log.warning("publisher %s closed with %d unsent batches", self.endpoint, unsent)
        with self._lock:  # a sender still encoding a batch checks _abandoned under this lock
            # live messages already handed to ZeroMQ get what is left of the timeout to leave
            self._sockets.close(int(max(0.0, deadline - time.monotonic()) * 1000))
        if self.config.metrics_port is not None:
            from kvevents.zeromq import metrics

            metrics.forget_publisher(self)
        return unsent

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _publish(
        self,
        events: Sequence[Event],
        ts: float,
        payload: bytes | None,
        ids: tuple[int | None, int | None] | None = None,
        stream_epoch: int | None = None,
    ) -> int:
        """The one publish path: seq, view, then send (caller mode) or enqueue (queue mode).

        `ids` (with `stream_epoch`) switch the stream identity under the lock, so a batch never
        goes out with another caller's rank and epoch; None keeps the current one (heartbeats).
        """
        q = self._queue
        with self._lock:
            if ids is not None:
                self._stream_id = ids
                self._stream_epoch = stream_epoch
            if payload is None and q is None:
                rank, epoch = self._stream_id
                try:
                    fast = self._fast_encode
                    if fast is not None:
                        wire = (float(ts), events, rank) if epoch is None else (float(ts), events, rank, epoch)
                        fast(wire, self._scratch)
                        payload = bytes(self._scratch)  # ~0.3 us cheaper than encode() for 4 KB
                    else:
                        payload = self._enc.encode(ts, events, rank, epoch)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise ValueError(f"publish: events cannot be encoded: {exc}") from None
            if self._closed:
                raise ValueError("publish: the publisher is closed")
            seq = self._seq
            self._seq = seq + 1
            if self._force_drop:
                self._force_drop -= 1
                self._stats["dropped_queue_full"] += 1
            elif q is None:
                self._emit(seq, payload)  # type: ignore[arg-type]
            else:
                try:
                    q.put_nowait((seq, ts, events, payload, self._stream_id))
                    self._pending += 1
                except queue.Full:
                    self._stats["dropped_queue_full"] += 1
            if events:  # after the send (ZeroMQ's I/O thread gets going), still under the lock
                self._n_events += len(events)
                if self._keep_view:
                    self._view.apply(events)  # dropped batches too: the snapshot heals their gap
                elif self._learn_page:
                    self._learn_page_size(events)
        return seq

    def _learn_page_size(self, events: Sequence[Event]) -> None:
        """No view (snapshots=False): DESCRIBE's page size, from the first BlockStored (an engine's is fixed)."""
        for ev in events:
            if ev.__class__ is BlockStored:
                self._view.page_size = ev.block_size  # type: ignore[union-attr]
                self._learn_page = False
                return

    def _emit(self, seq: int, payload: bytes) -> None:
        """Keep for replay and send live (under the lock): three plain sends, cheaper than send_multipart."""
        seq_b = pack_seq(seq)
        self._ring.append((seq, seq_b, payload))
        if self._drop_live:
            self._drop_live -= 1
            self._stats["dropped_live"] += 1
            return
        send = self._send
        try:
            send(self._topic_b, _MORE)
            send(seq_b, _MORE)
            send(payload, _LAST)
            self._n_bytes += len(payload)
        except zmq.ZMQError:
            self._stats["send_errors"] += 1

    def _send_loop(self) -> None:
        """Queue mode: encode and send one batch at a time (the vLLM design, bounded)."""
        q = self._queue
        assert q is not None
        while not self._abandoned:
            try:
                seq, ts, events, payload, ids = q.get(timeout=0.05)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            try:
                if payload is None:
                    payload = self._enc.encode(ts, events, *ids)
            except (TypeError, ValueError, OverflowError) as exc:
                payload = None
                log.error("publisher: batch %d could not be encoded and is lost: %s", seq, exc)
            with self._lock:
                if self._abandoned:  # close() counted this batch as unsent and closes the sockets
                    return
                self._pending -= 1
                if payload is None:
                    self._stats["encode_errors"] += 1
                else:
                    self._emit(seq, payload)

    def _next_seq(self) -> int:
        """The service loop's idle test: the seq the next batch gets (read without the lock)."""
        return self._seq

    def _heartbeat(self) -> int:
        """The service loop's heartbeat: one empty batch of the current stream; ValueError once closed."""
        self._svc_stats["heartbeats"] += 1  # counted first: a receiver may see it at once
        return self._publish([], time.time(), None)


def publish_steps(source: EventSource, publisher: Publisher) -> int | None:
    """Engine wiring, once per step: publish `source.take_events()` if any; returns the seq or None."""
    events = source.take_events()
    if not events:
        return None
    return publisher.publish(events)
