"""`kvevents demo`: the whole system on loopback (kvevents.demo.run_demo), rendered as tables, JSON
or an HTML page; exit 1 when a live check fails, 130 when interrupted."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Optional

import typer
from rich.console import Console

from kvevents.cli.app import CheckFailed, user_error
from kvevents.cli.output import out_console


def demo_cmd(
    workers: int = typer.Option(4, "--workers", help="Simulated workers (1..64), each with its own publisher."),
    duration: Optional[float] = typer.Option(
        None, "--duration", help="Seconds of traffic, about (default 15; not with --requests)."
    ),
    seed: int = typer.Option(0, "--seed", help="Workload, routing and fault seed."),
    requests: Optional[int] = typer.Option(
        None,
        "--requests",
        help="Run exactly N requests instead of --duration: the same seed then gives the same "
        "requests, policy figures, contract counts and events published (timings and batch counts vary).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (figures + checks) instead of tables."),
    fleet: str = typer.Option(
        "mixed",
        "--fleet",
        help="mixed: half the workers are vLLM 0.33 workers (vLLM's hashes, keyed by tokens); "
        "contract: every worker emits by the contract.",
    ),
    html_out: Optional[str] = typer.Option(
        None, "--html", help="Also write the run as one self-contained HTML page (hit rates over time, faults, checks)."
    ),
) -> None:
    """The main job: simulated workers publish on loopback, a prefix router routes, faults heal, checks run."""
    from kvevents.demo import DemoConfig

    if duration is not None and requests is not None:
        user_error("--duration and --requests exclude each other: a run is either timed or a number of requests")
    cfg = DemoConfig(workers=workers, seed=seed, fleet=fleet, requests=requests)
    if duration is not None:
        cfg.duration = duration
    # the demo injects faults on purpose: the transport's warnings about them would only be noise
    logging.getLogger("kvevents").setLevel(logging.ERROR)
    try:
        cfg.validate()
    except ValueError as exc:
        user_error(str(exc))
    if html_out is not None and not os.path.isdir(os.path.dirname(os.path.abspath(html_out))):
        user_error(f"--html {html_out}: no such directory")
    result = _run(cfg, as_json)
    if html_out is not None:
        _write_html(result, html_out)
    if result.get("interrupted"):  # Ctrl-C: the summary of the traffic so far was printed
        sys.stderr.write("kvevents demo: interrupted (Ctrl-C); the figures above cover the traffic until then\n")
        raise typer.Exit(130)
    failed = [name for name, ok in result["checks"].items() if not ok]
    if failed:
        raise CheckFailed(f"demo: {len(failed)} check(s) failed: {', '.join(failed)}")


def _run(cfg: Any, as_json: bool) -> dict[str, Any]:
    """Run the demo; print one JSON object, or a progress bar on stderr and the tables on stdout."""
    from kvevents.demo import DemoProgress, render_result, run_demo

    if as_json:
        result = run_demo(cfg)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        return result
    with DemoProgress(cfg.duration, Console(stderr=True)) as progress:
        result = run_demo(cfg, on_progress=progress)
    render_result(result, out_console())
    return result


def _write_html(result: dict[str, Any], path: str) -> None:
    from kvevents.demo.report import render_report

    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(render_report(result))
    except OSError as exc:
        user_error(f"--html {path}: {exc.strerror or exc}")
    sys.stderr.write(f"kvevents demo: report written to {path}\n")
