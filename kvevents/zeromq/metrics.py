"""Prometheus metrics of the transport: names defined once here, read from `stats()` at scrape time.

Nothing is incremented on the hot path: a custom collector asks each registered publisher or
subscriber for its counters when Prometheus scrapes, so publishing costs the same with metrics on.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Iterator

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "PUBLISHER_METRICS",
    "SUBSCRIBER_METRICS",
    "serve_publisher",
    "forget_publisher",
    "serve_subscriber",
    "forget_subscriber",
    "serving_ports",
]

# stats() key -> (metric name, help, kind)
PUBLISHER_METRICS: dict[str, tuple[str, str, str]] = {
    "batches_published": (
        "kvevents_publisher_batches_total",
        "Batches published (seq consumed), heartbeats included; ZeroMQ's own PUB HWM drops are not seen here (subscribers see a gap, replay heals it)",
        "counter",
    ),
    "events_published": ("kvevents_publisher_events_total", "Events published", "counter"),
    "heartbeats": ("kvevents_publisher_heartbeats_total", "Empty heartbeat batches published", "counter"),
    "dropped_queue_full": (
        "kvevents_publisher_dropped_total",
        "Batches dropped (queue full): unrecoverable gaps",
        "counter",
    ),
    "dropped_live": (
        "kvevents_publisher_dropped_live_total",
        "Batches not sent live by the test hook (replayable)",
        "counter",
    ),
    "send_errors": ("kvevents_publisher_send_errors_total", "Live sends that failed", "counter"),
    "bytes_sent": ("kvevents_publisher_bytes_sent_total", "Payload bytes sent (live, replay, snapshot)", "counter"),
    "encode_errors": (
        "kvevents_publisher_encode_errors_total",
        "Batches lost because they could not be encoded",
        "counter",
    ),
    "payloads_republished": (
        "kvevents_publisher_payloads_republished_total",
        "Recorded payloads republished",
        "counter",
    ),
    "replay_requests": ("kvevents_publisher_replay_requests_total", "Replay requests accepted", "counter"),
    "replays_served": (
        "kvevents_publisher_replays_served_total",
        "Replays fully sent (end marker included)",
        "counter",
    ),
    "replay_batches_sent": ("kvevents_publisher_replay_batches_total", "Batches sent by replay", "counter"),
    "snapshot_requests": ("kvevents_publisher_snapshot_requests_total", "KVE/SNAPSHOT requests accepted", "counter"),
    "snapshots_served": ("kvevents_publisher_snapshots_served_total", "Snapshots fully sent", "counter"),
    "snapshot_batches_sent": ("kvevents_publisher_snapshot_batches_total", "Batches sent by snapshots", "counter"),
    "describe_requests": ("kvevents_publisher_describe_requests_total", "KVE/DESCRIBE requests answered", "counter"),
    "rejected_requests": (
        "kvevents_publisher_rejected_requests_total",
        "Malformed or excess ROUTER requests (no reply)",
        "counter",
    ),
    "replies_abandoned": (
        "kvevents_publisher_replies_abandoned_total",
        "Replays/snapshots given up (peer gone or too slow)",
        "counter",
    ),
    "rejected_peer_cap": (
        "kvevents_publisher_rejected_peer_cap_total",
        "Replay/snapshot requests refused: the peer held its job cap",
        "counter",
    ),
    "rejected_oversized": (
        "kvevents_publisher_rejected_oversized_total",
        "ROUTER requests of more than 3 frames or an oversized body (discarded unread)",
        "counter",
    ),
    "jobs_expired": (
        "kvevents_publisher_jobs_expired_total",
        "Replays/snapshots dropped: the peer did not drain them in time",
        "counter",
    ),
    "rejected_describe_rate": (
        "kvevents_publisher_rejected_describe_rate_total",
        "KVE/DESCRIBE requests refused (no reply): the peer asked faster than its rate limit",
        "counter",
    ),
    "curve_denied": (
        "kvevents_publisher_curve_denied_total",
        "CURVE handshakes refused: the client's key is not on the allow-list",
        "counter",
    ),
    "queue_depth": ("kvevents_publisher_queue_depth", "Batches waiting in the send queue", "gauge"),
    "live_blocks": ("kvevents_publisher_live_blocks", "Live block copies in the snapshot view", "gauge"),
}

SUBSCRIBER_METRICS: dict[str, tuple[str, str, str]] = {
    "live": ("kvevents_subscriber_live_batches_total", "Live batches delivered", "counter"),
    "replayed": ("kvevents_subscriber_replayed_batches_total", "Replayed batches delivered", "counter"),
    "snapshot_batches": ("kvevents_subscriber_snapshot_batches_total", "Snapshot batches delivered", "counter"),
    "gaps": ("kvevents_subscriber_gaps_total", "Seq gaps detected", "counter"),
    "unrecoverable_gaps": ("kvevents_subscriber_unrecoverable_gaps_total", "Gaps replay could not fill", "counter"),
    "restarts": ("kvevents_subscriber_restarts_total", "Publisher restarts detected", "counter"),
    "resets": ("kvevents_subscriber_resets_total", "Resets sent to the consumer", "counter"),
    "losses": ("kvevents_subscriber_losses_total", "Clean starts without a snapshot (state lost)", "counter"),
    "bad_payloads": ("kvevents_subscriber_bad_payloads_total", "Payloads that failed to decode", "counter"),
    "duplicates": ("kvevents_subscriber_duplicates_total", "Batches dropped as duplicates", "counter"),
    "heartbeats": ("kvevents_subscriber_heartbeats_total", "Heartbeats received", "counter"),
    "replays_requested": ("kvevents_subscriber_replays_requested_total", "Replay requests sent", "counter"),
    "replay_timeouts": (
        "kvevents_subscriber_replay_timeouts_total",
        "Replay or snapshot requests timed out",
        "counter",
    ),
    "snapshots_requested": ("kvevents_subscriber_snapshots_requested_total", "Snapshot requests sent", "counter"),
    "snapshots_applied": ("kvevents_subscriber_snapshots_applied_total", "Snapshots delivered whole", "counter"),
    "snapshot_failures": ("kvevents_subscriber_snapshot_failures_total", "Snapshots that could not be used", "counter"),
    "bad_frames": ("kvevents_subscriber_bad_frames_total", "Malformed live messages", "counter"),
    "bad_replies": (
        "kvevents_subscriber_bad_replies_total",
        "Replay endpoint replies in neither replay framing (or of the wrong kind)",
        "counter",
    ),
    "requests_abandoned": (
        "kvevents_subscriber_requests_abandoned_total",
        "Replay, snapshot or describe requests given up without a usable answer (no retry)",
        "counter",
    ),
    "buffer_overflows": (
        "kvevents_subscriber_buffer_overflows_total",
        "Live buffers dropped during a long repair",
        "counter",
    ),
    "stale_sources": (
        "kvevents_subscriber_stale_sources_total",
        "Sources that went silent past stale_after_s",
        "counter",
    ),
    "callback_errors": ("kvevents_subscriber_callback_errors_total", "Consumer callbacks that raised", "counter"),
}

_lock = threading.Lock()
# port -> [server, thread, users]: one HTTP server per port, shut down when its last user leaves
_servers: dict[int, list[Any]] = {}
_ports: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # member -> its port


class _StatsCollector(Collector):
    def __init__(self, table: dict[str, tuple[str, str, str]], labels: tuple[str, ...]) -> None:
        self.table = table
        self.labels = labels
        self.members: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()

    def collect(self) -> Iterator[Any]:
        fams = {}
        for key, (name, doc, kind) in self.table.items():
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fams[key] = cls(name.removesuffix("_total") if kind == "counter" else name, doc, labels=self.labels)
        for obj, lv in list(self.members.items()):
            stats = obj.counters() if hasattr(obj, "counters") else obj.stats()
            for key, fam in fams.items():
                if key in stats:
                    fam.add_metric(list(lv), stats[key])
        yield from fams.values()


_pub_collector = _StatsCollector(PUBLISHER_METRICS, ("endpoint", "dp_rank"))
_sub_collector = _StatsCollector(SUBSCRIBER_METRICS, ("subscriber",))
_registered = False


def _acquire(obj: Any, port: int) -> int:
    """Register the collectors once, start the port's server unless running, count `obj` as a user;
    returns the port served. Port 0 starts a server of its own on a free port.

    OSError (port busy, ...) leaves nothing started and `obj` not counted.
    """
    global _registered
    with _lock:
        if not _registered:
            REGISTRY.register(_pub_collector)
            REGISTRY.register(_sub_collector)
            _registered = True
        if obj in _ports:
            return _ports[obj]
        entry = _servers.get(port) if port else None
        if entry is None:
            started = start_http_server(port, addr="127.0.0.1")  # (server, thread) since prometheus-client 0.20
            server, thread = started if isinstance(started, tuple) else (None, None)
            if not port:
                if server is None:  # pragma: no cover - prometheus-client < 0.20 cannot say which port
                    raise OSError("metrics port 0 needs prometheus-client >= 0.20")
                port = int(server.server_port)
            entry = _servers[port] = [server, thread, 0]
        entry[2] += 1
        _ports[obj] = port
        return port


def _release(obj: Any) -> None:
    """Forget `obj` as a user of its port; the last user stops the server and joins its thread."""
    with _lock:
        port = _ports.pop(obj, None)
        if port is None or (entry := _servers.get(port)) is None:
            return
        entry[2] -= 1
        if entry[2] > 0:
            return
        server, thread = entry[0], entry[1]
        if server is None:  # pragma: no cover - prometheus-client < 0.20 gives no handle: it keeps running
            return
        del _servers[port]
        server.shutdown()  # returns once serve_forever has left its loop (<= its 0.5 s poll interval)
        server.server_close()
        thread.join(5.0)


def serve_publisher(pub: Any, port: int) -> int:
    """Expose `pub.stats()` on http://127.0.0.1:port/metrics (one server per port, shared; port 0:
    a free one); returns the port. OSError when the port cannot be bound; `forget_publisher(pub)`
    stops the server with its last user.
    """
    port = _acquire(pub, port)
    _pub_collector.members[pub] = (pub.endpoint, str(pub.config.dp_rank))
    return port


def forget_publisher(pub: Any) -> None:
    """Stop exporting `pub` (idempotent); the port's server stops when nobody uses it any more."""
    _pub_collector.members.pop(pub, None)
    _release(pub)


def serve_subscriber(sub: Any, port: int, name: str = "default") -> int:
    """Expose `sub.counters()` on http://127.0.0.1:port/metrics (port 0: a free one); returns the
    port. OSError when the port is busy."""
    port = _acquire(sub, port)
    _sub_collector.members[sub] = (name,)
    return port


def forget_subscriber(sub: Any) -> None:
    """Stop exporting `sub` (idempotent); the port's server stops when nobody uses it any more."""
    _sub_collector.members.pop(sub, None)
    _release(sub)


def serving_ports() -> dict[int, int]:
    """Port -> number of publishers/subscribers using its metrics server (for tests and diagnostics)."""
    with _lock:
        return {port: entry[2] for port, entry in _servers.items()}
