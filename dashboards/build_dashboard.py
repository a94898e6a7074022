"""Writes dashboards/kvevents.json: the Grafana dashboard over kvevents' Prometheus metrics.

Run `python3 dashboards/build_dashboard.py` after changing a panel; tests/consumers/test_dashboard.py checks
that every metric the dashboard queries exists in a live scrape of a router, a publisher and a
subscriber, and that the file is what this script writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "kvevents.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
R = "[$__rate_interval]"


class Board:
    """Panels laid out left to right, 24 columns wide, in rows."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = 0
        self.y = 0
        self.h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": len(self.panels) + 1,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.h
            self.x = self.h = 0

    def panel(
        self,
        title: str,
        targets: list[tuple[str, str]],
        *,
        kind: str = "timeseries",
        unit: str = "short",
        w: int = 8,
        h: int = 8,
        desc: str = "",
        stack: bool = False,
        **extra: Any,
    ) -> None:
        if self.x + w > 24:
            self._newline()
        p: dict[str, Any] = {
            "type": kind,
            "title": title,
            "description": desc,
            "id": len(self.panels) + 1,
            "datasource": DS,
            "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
            "targets": [
                {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
                for i, (expr, legend) in enumerate(targets)
            ],
        }
        if stack:
            p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"}, "fillOpacity": 30}
        p.update(extra)
        self.panels.append(p)
        self.x += w
        self.h = max(self.h, h)


def rate(metric: str, by: str = "", sel: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}{sel}{R}))"


def build() -> dict[str, Any]:
    b = Board()
    b.row("Router (kvevents route)")
    b.panel(
        "POST /score requests/s",
        [(rate("kvevents_router_score_requests_total", "status"), "{{status}}")],
        unit="reqps",
        desc="Answered POST /score by HTTP status.",
    )
    b.panel(
        "Score latency",
        [
            (
                f"histogram_quantile({q}, sum by (le) (rate(kvevents_router_score_seconds_bucket{R})))",
                f"p{int(q * 100)}",
            )
            for q in (0.5, 0.9, 0.99)
        ],
        unit="s",
        desc="Hashing + index lookup per request.",
    )
    b.panel(
        "Routed to a worker holding a prefix",
        [
            (
                '1 - sum(rate(kvevents_router_score_matched_pages_bucket{le="0.0"}' + R + ")) / "
                "sum(rate(kvevents_router_score_matched_pages_count" + R + "))",
                "share",
            )
        ],
        unit="percentunit",
        desc="Share of /score answers whose best worker held at least one prefix page.",
    )
    b.panel(
        "Matched pages of the best worker",
        [("sum by (le) (increase(kvevents_router_score_matched_pages_bucket[$__range]))", "<= {{le}}")],
        kind="bargauge",
        w=8,
        desc="Cumulative: requests whose best worker held at most `le` pages.",
        options={"orientation": "horizontal", "displayMode": "basic"},
    )
    b.panel(
        "Batches applied/s",
        [(rate("kvevents_router_batches_applied_total", "kind"), "{{kind}}")],
        unit="ops",
        stack=True,
        desc="Live, replayed and snapshot batches applied to the index.",
    )
    b.panel(
        "Resets by source and reason",
        [("sum by (source, reason) (increase(kvevents_router_resets_total" + R + "))", "{{source}} {{reason}}")],
        desc="restart: a new publisher epoch; gap: an unrecoverable gap; first: first contact.",
    )
    b.panel(
        "Lag per source",
        [("max by (source) (kvevents_router_source_lag_seconds)", "{{source}}")],
        unit="s",
        desc="Receive time minus the batch's timestamp, last live batch.",
    )
    b.panel(
        "Stale sources",
        [("sum(kvevents_router_source_stale)", "stale")],
        kind="stat",
        w=4,
        desc="Sources silent for --stale-after seconds.",
    )
    b.panel("Last applied seq", [("max by (source) (kvevents_router_source_last_seq)", "{{source}}")], w=4, kind="stat")
    b.panel(
        "Block copies by worker and medium",
        [("sum by (worker, medium) (kvevents_router_block_copies)", "{{worker}} {{medium}}")],
        stack=True,
    )
    b.panel("Index entries", [("max(kvevents_router_index_entries)", "(lora_name, hash) entries")])
    b.panel(
        "Index outcomes/s",
        [(rate("kvevents_router_index_events_total", "reason"), "{{reason}}")],
        unit="ops",
        desc="unknown_remove, ambiguous_remove, dropped_* ...: what the index could not use, and why.",
    )
    b.panel(
        "Router's subscriber: repairs",
        [
            (
                "sum by (counter) (increase(kvevents_router_subscriber_events_total"
                '{counter=~"gaps|replayed|snapshots_applied|restarts|unrecoverable_gaps|losses"}' + R + "))",
                "{{counter}}",
            )
        ],
    )
    b.panel(
        "HTTP admission/s",
        [(rate("kvevents_router_http_admission_total", "outcome"), "{{outcome}}")],
        unit="ops",
        desc="Requests admitted, queued and refused (503: queue full, waited too long), idle connections "
        "closed past their cap; long_*: /score bodies over 64 KiB.",
    )

    b.row("Router: load and predictions (cost routing)")
    b.panel(
        "Scraped load by worker",
        [("sum by (worker, kind) (kvevents_router_worker_load_blocks)", "{{worker}} {{kind}}")],
        desc="Pages to prefill and held by running requests, from each engine's /metrics (route --metrics-url).",
    )
    b.panel(
        "Scraped queue by worker",
        [("max by (worker) (kvevents_router_worker_load_queue)", "{{worker}}")],
        desc="Requests waiting on each engine, as it reports.",
    )
    b.panel(
        "Load age",
        [("max by (worker) (kvevents_router_worker_load_age_seconds)", "{{worker}}")],
        unit="s",
        desc="Seconds since each worker's scraped load; past --load-stale-after /score says load_stale.",
    )
    b.panel(
        "Engine scrapes/s",
        [(rate("kvevents_router_load_scrapes_total", "source, outcome"), "{{source}} {{outcome}}")],
        unit="ops",
    )
    b.panel(
        "Predicted copies by worker",
        [("sum by (worker) (kvevents_router_predicted_blocks)", "{{worker}}")],
        stack=True,
        desc="Pages credited to routed requests' workers until their engines store them (never in the index).",
    )
    b.panel(
        "Predicted pages/s by outcome",
        [(rate("kvevents_router_predicted_pages_total", "outcome"), "{{outcome}}")],
        unit="ops",
        desc="credited; confirmed (the engine stored them), expired, evicted, replaced.",
    )

    b.row("Publishers")
    b.panel(
        "Batches and events/s",
        [
            (rate("kvevents_publisher_batches_total", "endpoint"), "batches {{endpoint}}"),
            (rate("kvevents_publisher_events_total", "endpoint"), "events {{endpoint}}"),
            (rate("kvevents_publisher_heartbeats_total", "endpoint"), "heartbeats {{endpoint}}"),
        ],
        unit="ops",
    )
    b.panel(
        "Drops and errors",
        [
            (rate("kvevents_publisher_dropped_total", "endpoint"), "queue full {{endpoint}}"),
            (rate("kvevents_publisher_dropped_live_total", "endpoint"), "dropped live {{endpoint}}"),
            (rate("kvevents_publisher_send_errors_total", "endpoint"), "send errors {{endpoint}}"),
            (rate("kvevents_publisher_encode_errors_total", "endpoint"), "encode errors {{endpoint}}"),
        ],
        unit="ops",
        desc="Queue-full drops are unrecoverable gaps; dropped live frames are replayable.",
    )
    b.panel(
        "Replays and snapshots served",
        [
            (rate("kvevents_publisher_replay_requests_total"), "replay requests"),
            (rate("kvevents_publisher_replays_served_total"), "replays served"),
            (rate("kvevents_publisher_replay_batches_total"), "replayed batches"),
            (rate("kvevents_publisher_snapshot_requests_total"), "snapshot requests"),
            (rate("kvevents_publisher_snapshots_served_total"), "snapshots served"),
            (rate("kvevents_publisher_snapshot_batches_total"), "snapshot batches"),
        ],
        unit="ops",
    )
    b.panel("Send queue depth", [("max by (endpoint) (kvevents_publisher_queue_depth)", "{{endpoint}}")])
    b.panel(
        "Live blocks (snapshot view)",
        [("sum by (endpoint, dp_rank) (kvevents_publisher_live_blocks)", "{{endpoint}} rank {{dp_rank}}")],
    )
    b.panel("Bytes sent/s", [(rate("kvevents_publisher_bytes_sent_total", "endpoint"), "{{endpoint}}")], unit="Bps")
    b.panel(
        "Refused and abandoned requests",
        [
            (rate("kvevents_publisher_rejected_requests_total"), "rejected"),
            (rate("kvevents_publisher_rejected_peer_cap_total"), "peer cap"),
            (rate("kvevents_publisher_rejected_oversized_total"), "oversized"),
            (rate("kvevents_publisher_replies_abandoned_total"), "abandoned"),
            (rate("kvevents_publisher_jobs_expired_total"), "expired"),
            (rate("kvevents_publisher_describe_requests_total"), "describe"),
            (rate("kvevents_publisher_rejected_describe_rate_total"), "describe over rate"),
            (rate("kvevents_publisher_payloads_republished_total"), "republished"),
            (rate("kvevents_publisher_curve_denied_total"), "CURVE denied"),
        ],
        unit="ops",
        w=16,
    )

    b.row("Subscribers")
    b.panel(
        "Batches delivered/s",
        [
            (rate("kvevents_subscriber_live_batches_total", "subscriber"), "live {{subscriber}}"),
            (rate("kvevents_subscriber_replayed_batches_total", "subscriber"), "replayed {{subscriber}}"),
            (rate("kvevents_subscriber_snapshot_batches_total", "subscriber"), "snapshot {{subscriber}}"),
            (rate("kvevents_subscriber_heartbeats_total", "subscriber"), "heartbeats {{subscriber}}"),
        ],
        unit="ops",
    )
    b.panel(
        "Gaps, restarts, losses",
        [
            (f"sum(increase({m}{R}))", label)
            for m, label in (
                ("kvevents_subscriber_gaps_total", "gaps"),
                ("kvevents_subscriber_unrecoverable_gaps_total", "unrecoverable gaps"),
                ("kvevents_subscriber_restarts_total", "restarts"),
                ("kvevents_subscriber_resets_total", "resets"),
                ("kvevents_subscriber_losses_total", "losses"),
                ("kvevents_subscriber_duplicates_total", "duplicates"),
                ("kvevents_subscriber_buffer_overflows_total", "buffer overflows"),
            )
        ],
    )
    b.panel(
        "Replay and snapshot requests",
        [
            (f"sum(increase({m}{R}))", label)
            for m, label in (
                ("kvevents_subscriber_replays_requested_total", "replays requested"),
                ("kvevents_subscriber_replay_timeouts_total", "timeouts"),
                ("kvevents_subscriber_snapshots_requested_total", "snapshots requested"),
                ("kvevents_subscriber_snapshots_applied_total", "snapshots applied"),
                ("kvevents_subscriber_snapshot_failures_total", "snapshot failures"),
                ("kvevents_subscriber_requests_abandoned_total", "abandoned (no usable answer)"),
            )
        ],
    )
    b.panel(
        "Bad input and callback errors",
        [
            (f"sum(increase({m}{R}))", label)
            for m, label in (
                ("kvevents_subscriber_bad_payloads_total", "bad payloads"),
                ("kvevents_subscriber_bad_frames_total", "bad frames"),
                ("kvevents_subscriber_bad_replies_total", "bad replay replies"),
                ("kvevents_subscriber_callback_errors_total", "callback errors"),
                ("kvevents_subscriber_stale_sources_total", "went stale"),
            )
        ],
        w=24,
        h=6,
    )
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "Scrapes kvevents route, publishers (--metrics-port) and subscribers",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ],
        "title": "kvevents: KV event transport and prefix router",
        "uid": "kvevents",
        "description": "Publishers, subscribers and kvevents route (README: Seeing it).",
        "tags": ["kvevents", "kv-cache", "llm"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timezone": "",
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": b.panels,
    }


def main() -> int:
    OUT.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
