"""`kvevents demo --html FILE`: one self-contained page (inline SVG, no script, no external URL) with
hit rates per policy over time, the faults against the router's backlog and repairs, and the checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvevents.demo.report import _ticks, line_chart
from tests.helpers.cli import invoke

URL = re.compile(r"(?i)(?:https?:|ftp:|wss?:)?//[a-z0-9.-]+")


def test_demo_html_report(tmp_path: Path):
    out = tmp_path / "report.html"
    proc = invoke("demo", "--duration", "2", "--seed", "2", "--json", "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert f"report written to {out}" in proc.stderr
    page = out.read_text()
    assert "http://" not in page and "https://" not in page and not URL.search(page)
    assert "<script" not in page and " src=" not in page and "<link" not in page
    # the timeline the page is drawn from: samples over the run, both faults marked on its clock
    tl = result["timeline"]
    assert len(tl["samples"]) >= 5
    assert [m["kind"] for m in tl["marks"]] == ["drop", "restart"]
    assert tl["samples"][-1]["repairs"]["replayed"] >= 1 and tl["samples"][-1]["repairs"]["restarts"] >= 1
    for policy in ("prefix", "random", "round_robin"):
        assert f'data-series="{policy}"' in page
    assert page.count("<svg") == 4  # hit rate, backlog, lag, repairs
    for name in result["checks"]:
        assert name in page
    assert page.count(">PASS<") == len(result["checks"]) and "every check passed" in page
    assert "drop " + result["faults"]["drop_worker"] in page and "restart " + result["faults"]["restart_worker"] in page


def test_demo_html_into_a_missing_directory_is_one_line(tmp_path: Path):
    proc = invoke("demo", "--duration", "1", "--html", str(tmp_path / "no" / "r.html"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such directory" in proc.stderr


def test_chart_ticks_and_gaps():
    assert _ticks(6.001, 8) == [0, 1, 2, 3, 4, 5, 6]
    assert _ticks(1.0) == [0, 0.25, 0.5, 0.75, 1.0]
    svg = line_chart({"a": [(0, 1.0), (1, None), (2, 3.0)]}, x_max=2, y_label="y")
    d = re.search(r'd="([^"]*)"', svg).group(1)
    assert d.count("M") == 2  # a missing value breaks the line
