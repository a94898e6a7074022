"""The status page of `kvevents route` without a browser: server-rendered numbers, no external URL,
the per-second ring (with its own clock), copies by adapter."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.service.status import MATCHED_BUCKETS, StatusBoard, page_template
from kvevents.events import BlockStored, KVEventBatch
from tests.helpers.route_live import LiveRoute, as_number
from tests.helpers.wait import wait_until

URL = re.compile(r"(?i)\b(?:https?:|ftp:|wss?:)?//[a-z0-9.-]+")


class Cells(HTMLParser):
    """Text of every `data-k` cell per worker row (data-worker, data-rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[tuple[str, str], dict[str, str]] = {}
        self._row: tuple[str, str] | None = None
        self._key: str | None = None
        self._depth = 0
        self.attrs_seen: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.attrs_seen += [(k, v) for k, v in a.items() if k in ("src", "href", "action")]
        if tag == "tr" and "data-worker" in a:
            self._row = (a["data-worker"], a["data-rank"])
            self.rows[self._row] = {}
        elif self._row is not None and "data-k" in a and tag in ("td", "th"):
            self._key = a["data-k"]
            self.rows[self._row][self._key] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._key = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._key is not None:
            self.rows[self._row][self._key] += data


def check_rows(rows: dict[tuple[str, str], dict[str, str]], workers: list[dict]) -> None:
    """The page's worker rows hold /workers' numbers (blocks by medium; seq may have moved on)."""
    assert {(w["worker"], str(w["dp_rank"])) for w in workers} == set(rows)
    for w in workers:
        row = rows[(w["worker"], str(w["dp_rank"]))]
        assert row["state"].strip() in ("healthy", "repairing", "stale")
        assert as_number(row["blocks"]) == pytest.approx(w["blocks"], rel=0.5)
        for medium in w["blocks_by_medium"]:
            assert f"medium:{medium}" in row
        assert row["last_seq"].strip() != "–"


def test_board_ring_uses_its_clock_and_windows():
    now = [100.0]
    board = StatusBoard(clock=lambda: now[0], ring_seconds=5)
    for t in range(8):  # 8 samples into a ring of 5: the oldest go
        now[0] = 100.0 + t
        if t == 2:
            board.delivered("a", "replay")
            board.delivered("a", "replay")  # one run of replays: one healed gap
            board.delivered("a", "live")
        if t == 4:
            board.reset("a", "restart")
            board.delivered("a", "snapshot")
            board.delivered("a", "snapshot")
            board.reset("a", "gap")
            board.scored(0)
            board.scored(5)
        board.sample()
    act = board.activity(window_s=60)
    a = act["sources"]["a"]
    assert a["total"] == {"gaps": 2, "replays": 2, "snapshots": 1, "restarts": 1}
    assert a["window"] == {"gaps": 1, "replays": 0, "snapshots": 1, "restarts": 1}  # t=2 fell out of the ring
    assert len(a["series"]["restarts"]) == 5 and sum(a["series"]["restarts"]) == 1
    sc = act["score"]
    assert sc["requests_total"] == 2 and sc["prefix_share_total"] == 0.5
    assert [b["requests"] for b in sc["matched_pages"]] == [1, 0, 0, 1] + [0] * (len(MATCHED_BUCKETS) - 4)
    assert sc["matched_pages"][3]["pages"] == "4-7" and sc["matched_pages"][-1]["pages"].endswith("+")


def test_adapter_counts_sum_to_the_worker_copies():
    idx = BlockIndex()
    idx.apply(
        "s",
        KVEventBatch(
            ts=1.0,
            events=[
                BlockStored(
                    block_hashes=[1, 2, 3],
                    parent_block_hash=None,
                    token_ids=[0] * 48,
                    block_size=16,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                ),
            ],
        ),
    )
    idx.apply(
        "s",
        KVEventBatch(
            ts=1.0,
            events=[
                BlockStored(
                    block_hashes=[4, 5],
                    parent_block_hash=None,
                    token_ids=[0] * 32,
                    block_size=16,
                    lora_id=7,
                    medium="GPU",
                    lora_name="ad",
                ),
            ],
        ),
    )
    idx.apply(
        "t",
        KVEventBatch(
            ts=1.0,
            events=[
                BlockStored(
                    block_hashes=[1],
                    parent_block_hash=None,
                    token_ids=[0] * 16,
                    block_size=16,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                ),
            ],
        ),
    )
    assert idx.adapter_counts() == {"s": {"": 3, "ad": 2}, "t": {"": 1}}
    assert sum(idx.adapter_counts()["s"].values()) == sum(idx.block_counts()["s"].values())


def test_template_has_no_external_url():
    page = page_template()
    assert "http://" not in page and "https://" not in page
    assert not URL.search(page), URL.search(page)
    assert "<script src" not in page and "<link" not in page


@pytest.fixture(scope="module")
def live():
    with LiveRoute() as route:
        route.wait_ready()
        route.score_requests(40)
        yield route


@pytest.mark.subprocess
def test_get_root_is_the_page_rendered_without_javascript(live):
    status, headers, body = live.get("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in headers["content-security-policy"]
    page = body.decode()
    assert "http://" not in page and "https://" not in page and not URL.search(page)
    # strip the script: what is left must already carry the table (a browser without JavaScript)
    static = re.sub(r"(?s)<script>.*?</script>", "", page)
    cells = Cells()
    cells.feed(static)
    assert not cells.attrs_seen  # no src / href / action at all
    check_rows(cells.rows, live.get_json("/workers")["workers"])
    assert 'id="sources"' in static and 'id="matched"' in static and 'data-k="prefix_share"' in static


@pytest.mark.subprocess
def test_status_json_adds_adapters_activity_and_score(live):
    live.service.status.adapter_refresh_s = 0  # recount copies by adapter on every call (default: every 5 s)

    def adapters_add_up(s: dict) -> bool:
        # /workers and the adapter count take the index lock one after the other: batches may land
        # between (a loaded box lands many), so a sample whose counts agree must come soon
        return all(sum(w["blocks_by_adapter"].values()) == pytest.approx(w["blocks"], rel=0.2) for w in s["workers"])

    wait_until("adapter counts that add up", lambda: adapters_add_up(live.get_json("/status.json")))
    s = live.get_json("/status.json")
    workers = {(w["worker"], w["dp_rank"]): w for w in s["workers"]}
    assert set(workers) == {("w0", 0), ("w1", 1)}
    for w in workers.values():
        assert set(w["blocks_by_adapter"]) <= set(s["adapters"])
    sc = s["score"]
    assert sc["requests_total"] >= 40
    assert sum(b["requests"] for b in sc["matched_pages"]) == sc["requests_total"]
    assert 0 < sc["prefix_share_total"] <= 1
    wait_until("two seconds of samples", lambda: live.get_json("/status.json")["window_s"] >= 2)
    s = live.get_json("/status.json")
    assert set(s["sources"]) == {"w0", "w1"}
    assert all(len(src["series"]["gaps"]) >= 2 for src in s["sources"].values())
    assert live.get_json("/healthz")["ok"] is True
