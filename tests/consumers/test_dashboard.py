"""dashboards/kvevents.json against live scrapes: every metric its PromQL queries exists on the
/metrics of a real `kvevents route` fed by `kvevents serve`, of that publisher (--metrics-port) or of
the router's subscriber (metrics_port); names follow Prometheus conventions; the README documents each."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from kvevents.consumers.service.metrics import METRIC_NAMES
from kvevents.zeromq.metrics import PUBLISHER_METRICS, SUBSCRIBER_METRICS
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source
from tests.helpers.repo import REPO
from tests.helpers.route_live import LiveRoute
from tests.helpers.wait import wait_until

EPH = "tcp://127.0.0.1:*"

DASHBOARD = REPO / "dashboards" / "kvevents.json"
NAME = re.compile(r"\bkvevents_[a-z0-9_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def scrape_names(text: str) -> tuple[set[str], dict[str, str]]:
    """(every series name a query may use, family -> type) from Prometheus text."""
    names: set[str] = set()
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, fam, kind = line.split()
            fam = fam.removesuffix("_total") if kind == "counter" else fam  # prometheus-client writes either
            types[fam] = kind
            names.update(fam + s for s in SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names, types


def dashboard_exprs(board: dict) -> list[str]:
    out = []
    for p in board["panels"]:
        for t in p.get("targets", []):
            out.append(t["expr"])
    return out


@pytest.fixture(scope="module")
def scrapes():
    """Scrapes after traffic, /score requests and a publisher restart (so resets are exported too)."""
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, bind=True, heartbeat_interval_s=0.1)
    try:
        with LiveRoute(rate=40, extra=[Source(pub.endpoint, pub.replay_endpoint, "x")]) as live:
            live.wait_ready()
            wait_until("the router to hear x", lambda: live.service.applied_seq("x") is not None)
            endpoint, replay = pub.endpoint, pub.replay_endpoint
            pub.close(timeout=0.2)  # a restart: a new epoch on the same ports
            pub = Publisher(endpoint=endpoint, replay_endpoint=replay, bind=True, heartbeat_interval_s=0.1)
            wait_until(
                "the restart to be seen",
                lambda: re.search(rb'kvevents_router_resets_total\{[^}]*reason="restart"', live.get("/metrics")[2]),
            )
            texts = _scrape(live)
    finally:
        pub.close(timeout=0.2)
    return texts


def _scrape(live: LiveRoute) -> dict[str, str]:
    live.score_requests(20)
    sub_port = live.service.subscriber.metrics_port if live.service.subscriber else None
    assert sub_port and live.publisher_metrics_port
    wait_until("lag samples", lambda: b"kvevents_router_source_lag_seconds{" in live.get("/metrics")[2])
    return {
        "router": live.get("/metrics")[2].decode(),
        "publisher": live.get("/metrics", live.publisher_metrics_port)[2].decode(),
        "subscriber": live.get("/metrics", sub_port)[2].decode(),
    }


@pytest.mark.subprocess
def test_every_dashboard_metric_is_in_a_live_scrape(scrapes):
    board = json.loads(DASHBOARD.read_text())
    have: set[str] = set()
    for text in scrapes.values():
        have |= scrape_names(text)[0]
    queried = {n for e in dashboard_exprs(board) for n in NAME.findall(e)}
    assert queried, "the dashboard queries nothing"
    missing = sorted(queried - have)
    assert not missing, f"the dashboard queries metrics no endpoint exports: {missing}"
    # the prefix-share panel divides by the le="0.0" bucket: that label value must exist as written
    assert 'kvevents_router_score_matched_pages_bucket{le="0.0"}' in scrapes["router"]


@pytest.mark.subprocess
def test_dashboard_covers_every_metric_and_uses_the_datasource_input(scrapes):
    board = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    exprs = " ".join(dashboard_exprs(board))
    families = set()
    for text in scrapes.values():
        families |= {f for f in scrape_names(text)[1] if f.startswith("kvevents_") and not f.endswith("_created")}
    unused = sorted(f for f in families if f not in exprs)
    assert not unused, f"metrics no panel shows: {unused}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}"
    assert "http://" not in DASHBOARD.read_text() and "https://" not in DASHBOARD.read_text()


def test_dashboard_file_is_what_the_builder_writes():
    spec = importlib.util.spec_from_file_location("build_dashboard", REPO / "dashboards" / "build_dashboard.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert json.loads(DASHBOARD.read_text()) == mod.build(), "run python3 dashboards/build_dashboard.py"


@pytest.mark.subprocess
def test_metric_names_follow_prometheus_conventions(scrapes):
    for text in scrapes.values():
        _, types = scrape_names(text)
        for line in text.splitlines():
            if line.startswith("kvevents_"):
                fam = re.split(r"[{ ]", line, maxsplit=1)[0]
                base = fam.removesuffix("_total")
                if types.get(base) == "counter":
                    assert fam.endswith("_total"), f"{fam}: a counter's samples end in _total"
        for fam, kind in types.items():
            if not fam.startswith("kvevents_"):
                continue
            assert kind in ("counter", "gauge", "histogram"), (fam, kind)
            assert not fam.endswith("_total"), f"{fam}: only counters end in _total"
            if kind == "histogram" and "seconds" not in fam:
                assert fam.endswith("_pages"), f"{fam}: a histogram names its unit"
    for table in (PUBLISHER_METRICS, SUBSCRIBER_METRICS):
        for name, _, kind in table.values():
            assert name.endswith("_total") == (kind == "counter"), name


def test_readme_documents_every_metric():
    readme = (REPO / "README.md").read_text()
    names = list(METRIC_NAMES.values()) + [n for n, _, _ in PUBLISHER_METRICS.values()]
    names += [n for n, _, _ in SUBSCRIBER_METRICS.values()]
    undocumented = [n for n in names if f"`{n}`" not in readme]
    assert not undocumented, f"README's metrics table lacks: {undocumented}"
