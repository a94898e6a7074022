"""The demo tells its story (issue 15): the summary fits 80 columns with whole check names and
one line per policy, says what each table shows, ends with a verdict; --requests N reproduces a
run; piped, a line per phase; Ctrl-C prints what was measured and exits 130."""

from __future__ import annotations

import copy
import os
import signal
import time

import pytest
from rich.console import Console

from kvevents.demo.render import render_result, verdict
from kvevents.demo.run import REPRODUCIBLE, DemoConfig, run_demo
from tests.helpers.cli import run, spawn


@pytest.fixture(scope="module")
def mixed() -> dict:
    return run_demo(DemoConfig(requests=250, seed=5))


def _render(result: dict, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False, file=open(os.devnull, "w"))
    render_result(result, console)
    return console.export_text().splitlines()


def _at(result: dict, path: str):
    for key in path.split("."):
        result = result[key]
    return result


def test_summary_fits_80_columns_with_whole_names_and_a_verdict(mixed):
    assert mixed["ok"], mixed["checks"]
    lines = _render(mixed)
    assert max(len(ln) for ln in lines) <= 80, [ln for ln in lines if len(ln) > 80]
    for name in mixed["checks"]:  # every check name whole, on its own line after PASS/FAIL
        assert any(ln.split() == ["PASS", name] for ln in lines), name
    for label in ("prefix router (served)", "random (shadow)", "round-robin (shadow)"):  # one line per policy
        row = next(ln for ln in lines if label in ln)
        assert row.count("%") == 3 and row.split()[-1].replace(".", "").isdigit(), row  # load max/mean ends it
    assert lines[0].startswith("kvevents demo: 4 workers (2 contract + 2 vLLM), 250 requests in ")
    assert f"{len(mixed['checks'])}/{len(mixed['checks'])} checks passed" in lines
    assert verdict(mixed) == "6/6 checks passed"
    text = "\n".join(lines)
    assert "1 restarts" not in text and "1 workers" not in text
    assert "Reproducible: --seed 5 --requests 250" in text


def test_applied_vs_published_is_explained_and_grammar_is_singular(mixed):
    odd = copy.deepcopy(mixed)
    odd["transport"]["events_applied"] = odd["transport"]["events_published"] + 2
    odd["workers"], odd["engines"], odd["requests"] = 1, {"worker-0": "contract"}, 1
    odd["checks"]["router_index_equals_worker_caches"] = False
    odd["ok"] = False
    text = " ".join(_render(odd))
    assert "The router applied +2 events vs published: a restarted worker's snapshot" in text
    assert text.startswith("kvevents demo: 1 worker, 1 request in ")
    assert "5/6 checks passed; failed: router_index_equals_worker_caches" in text


def test_requests_n_reproduces_the_figures(mixed):
    again = run_demo(DemoConfig(requests=250, seed=5))
    assert again["reproducible"] == list(REPRODUCIBLE)
    for path in REPRODUCIBLE:
        assert _at(again, path) == _at(mixed, path), path
    other = run_demo(DemoConfig(requests=250, seed=6))
    assert other["policies"] != mixed["policies"]  # the seed matters


def test_prefill_figures_are_per_policy():
    out = run_demo(DemoConfig(requests=200, seed=1, fleet="contract"))
    pol = out["policies"]
    for p in pol.values():
        assert (
            p["device_tokens_reused"] + p["storage_tokens_loaded"] + p["prefill_tokens_recomputed"]
            == p["prompt_tokens"]
        )
    assert pol["prefix"]["device_tokens_reused"] > pol["random"]["device_tokens_reused"]
    text = " ".join(_render(out))
    same = len({p["prefill_tokens_recomputed"] for p in pol.values()}) == 1
    assert ("All three recompute the same tokens because the shared tier keeps every page" in text) == same


@pytest.mark.subprocess
def test_cli_piped_prints_a_line_per_phase_and_fits_80_columns():
    r = run("demo", "--requests", "200", "--seed", "3", timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    phases = [ln for ln in r.stderr.splitlines() if ln.startswith("demo: ")]
    assert any("routing 200 requests" in ln for ln in phases) and any("dropping" in ln for ln in phases)
    assert any("restarting" in ln for ln in phases) and any("traffic done" in ln for ln in phases)
    out = r.stdout.splitlines()
    assert max(len(ln) for ln in out) <= 80
    assert "6/6 checks passed" in out


@pytest.mark.subprocess
@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_ctrl_c_prints_what_was_measured_and_exits_130():
    proc = spawn("demo", "--duration", "60")
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the phase line says the traffic runs
            if "routing requests" in proc.stderr.readline():
                break
        time.sleep(0.5)  # some traffic to measure
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert out.startswith("kvevents demo: 4 workers") and "Interrupted (Ctrl-C)" in out
    assert "checks passed" in out and "(interrupted after" in out
    assert "Traceback" not in err
