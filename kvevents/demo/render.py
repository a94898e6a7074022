"""Rich rendering of the demo: a progress line (or a line per phase when piped), then a summary
that fits 80 columns: transport, routing policies, the live checks and a closing verdict."""

from __future__ import annotations

import textwrap
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["DemoProgress", "render_result", "check_details", "verdict"]

WIDTH = 80  # the summary fits a standard terminal; a wider console keeps the same layout
_POLICY_LABELS = {
    "prefix": "prefix router (served)",
    "random": "random (shadow)",
    "round_robin": "round-robin (shadow)",
}

#: What each live check shows, one line each (the summary and the HTML report).
_MEANINGS = {
    "no_published_hash_moved_by_extra_key": "published block hashes depend on tokens and cache_salt only, not the LoRA",
    "storage_never_served_across_namespaces": "the shared storage tier never served a page to another namespace",
    "router_index_equals_worker_caches": "after a drop and a restart, the router's index equals the workers' caches",
    "injected_faults_observed": "the dropped frames were replayed and the restart was detected",
    "key_mode_detected_per_source": "each source's hashes were recognised (contract, or vLLM keyed by tokens)",
    "vllm_prefix_found_as_on_contract_worker": "a prefix cached on a vLLM worker scores as on a contract worker",
}


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


class DemoProgress:
    """A rich progress bar over the run with live hit rates (a context manager); on a console that is
    not a terminal (piped), a plain line per phase and per quarter of the run instead."""

    def __init__(self, duration: float, console: Console) -> None:
        self.duration = duration
        self.console = console
        self.live = console.is_terminal
        self._quarter = 0
        self.progress = Progress(
            TextColumn("[bold]demo[/]"),
            BarColumn(bar_width=20),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task("run", total=1.0, info="starting")

    def __enter__(self) -> DemoProgress:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

    def phase(self, text: str) -> None:
        """One line per phase of the run (above the bar on a terminal)."""
        self.console.print(f"demo: {escape(text)}", highlight=False, soft_wrap=True)

    def __call__(self, elapsed: float, figures: dict[str, Any]) -> None:
        done = float(figures.get("fraction", elapsed / self.duration if self.duration else 0.0))
        info = (
            f"{figures['requests']:,} req  device cache hit: prefix {figures['prefix']:.0%} "
            f"random {figures['random']:.0%} rr {figures['round_robin']:.0%}"
        )
        if self.live:
            self.progress.update(self.task, completed=min(done, 1.0), info=info)
        elif int(done * 4) > self._quarter and done < 1.0:
            self._quarter = int(done * 4)
            self.phase(f"{self._quarter * 25}%: {info}")


def _say(console: Console, text: str, style: str = "") -> None:
    """A paragraph wrapped at 80 columns (plain text, no markup)."""
    for line in textwrap.wrap(text, width=min(WIDTH, console.width)) or [""]:
        console.print(line, style=style or None, markup=False, highlight=False, soft_wrap=True)


def headline(result: dict[str, Any]) -> str:
    engines = result.get("engines", {})
    n_vllm = sum(1 for e in engines.values() if e == "vllm")
    n = result["workers"]
    fleet = f" ({n - n_vllm} contract + {n_vllm} vLLM)" if n_vllm else ""
    return (
        f"kvevents demo: {_plural(n, 'worker')}{fleet}, {_plural(result['requests'], 'request')} in "
        f"{result['duration_s']:.1f} s, seed {result['seed']}"
    )


def render_result(result: dict[str, Any], console: Console) -> None:
    """The summary: what was run, transport, routing policies, the checks, one verdict line."""
    _say(console, headline(result), "bold")
    if result.get("interrupted"):
        _say(
            console,
            "Interrupted (Ctrl-C): the figures cover the traffic up to then; the router still "
            "caught up and the checks ran on what was published.",
            "yellow",
        )
    console.print(_transport_table(result))
    t = result["transport"]
    diff = t["events_applied"] - t["events_published"]
    if diff:
        _say(
            console,
            f"The router applied {diff:+,} events vs published: a restarted worker's snapshot "
            "re-delivers the blocks it holds, and replaces batches of the old epoch (and the new epoch's "
            "first clear) that the router had not applied.",
        )
    console.print(_policy_table(result))
    for line in _policy_story(result):
        _say(console, line)
    console.print(_checks_grid(result, min(WIDTH, console.width)))
    ok = verdict(result)
    console.print(ok, style="bold green" if result.get("ok") else "bold red", markup=False, highlight=False)
    _say(console, _reproducibility(result), "dim")


def _transport_table(result: dict[str, Any]) -> Table:
    t, faults = result["transport"], result["faults"]
    table = Table(
        title="transport: what the router received and repaired",
        box=box.SIMPLE,
        title_justify="left",
        show_header=False,
    )
    table.add_column("", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    applied = t["batches_applied"]
    rows = [
        ("events published / applied by the router", f"{t['events_published']:,} / {t['events_applied']:,}"),
        ("batches published (heartbeats incl.)", f"{t['batches_published']:,}"),
        (
            "batches applied live / replay / snapshot",
            " / ".join(f"{applied.get(k, 0):,}" for k in ("live", "replay", "snapshot")),
        ),
        (
            f"live frames dropped on {faults['drop_worker']} (injected)"
            if faults["drop_worker"]
            else "live frames dropped (not injected yet)",
            str(faults["dropped_live"]),
        ),
        ("gaps detected / healed by replay", f"{t['gaps_detected']} / {t['gaps_healed_by_replay']}"),
        (
            f"restart of {faults['restart_worker']}: injected / detected"
            if faults["restart_worker"]
            else "restarts: injected / detected",
            f"{1 if faults['restart_worker'] else 0} / {t['restarts_detected']}",
        ),
        ("resyncs by snapshot", str(t["resyncs_by_snapshot"])),
        ("state losses (nothing could repair them)", str(t["losses"])),
        ("router caught up after the traffic in", f"{t['settle_s']:.2f} s"),
    ]
    for name, value in rows:
        table.add_row(escape(name), value)
    return table


def _policy_table(result: dict[str, Any]) -> Table:
    table = Table(
        title="routing policies: the same requests, each on its own cluster", box=box.SIMPLE_HEAD, title_justify="left"
    )
    table.add_column("policy", no_wrap=True)
    for col in ("device\nhits", "storage\nloads", "prefill\nrecomputed", "load\nmax/mean"):
        table.add_column(col, justify="right", no_wrap=True)
    for name, p in result["policies"].items():
        recomputed = p.get("prefill_tokens_recomputed", p["prompt_tokens"] - p["prefill_tokens_saved"])
        table.add_row(
            _POLICY_LABELS.get(name, name),
            f"{p['device_hit_rate']:.1%}",
            f"{p['storage_hit_rate']:.1%}",
            f"{recomputed:,} ({recomputed / max(1, p['prompt_tokens']):.0%})",
            f"{p['load_max_over_mean']:.2f}",
        )
    return table


def _policy_story(result: dict[str, Any]) -> list[str]:
    """What the policy table shows, in a sentence or two."""
    pol = result["policies"]
    lines = [
        "device hits: prompt tokens already on the chosen worker's GPU; storage loads: pages "
        "fetched from the shared tier instead; recomputed: prompt tokens prefilled from scratch."
    ]
    if {"prefix", "random", "round_robin"} <= set(pol):
        dev = {k: pol[k]["device_hit_rate"] for k in ("prefix", "random", "round_robin")}
        story = (
            f"Prefix routing found {dev['prefix']:.0%} of prompt tokens on the chosen GPU, "
            f"random {dev['random']:.0%}, round-robin {dev['round_robin']:.0%}."
        )
        rec = [pol[k].get("prefill_tokens_recomputed") for k in ("prefix", "random", "round_robin")]
        if rec[0] is not None and rec[0] == rec[1] == rec[2]:
            story += (
                " All three recompute the same tokens because the shared tier keeps every page: "
                "routing decides whether a reused page is already on the GPU or has to be loaded."
            )
        lines.append(story)
    return lines


def _checks_grid(result: dict[str, Any], width: int) -> Table:
    details = check_details(result)
    grid = Table(title="live checks", box=None, show_header=False, title_justify="left", width=width, pad_edge=False)
    grid.add_column(width=4, no_wrap=True)
    grid.add_column(ratio=1)
    for name, ok in result["checks"].items():
        text = f"[bold]{escape(name)}[/]\n{escape(_MEANINGS.get(name, ''))}"
        if details.get(name):
            text += f"\n[dim]{escape(details[name])}[/]"
        grid.add_row("[green]PASS[/]" if ok else "[red]FAIL[/]", text)
    return grid


def check_details(result: dict[str, Any]) -> dict[str, str]:
    """One line per live contract check saying what was measured (the tables and the HTML report)."""
    c = result["contract"]
    t = result["transport"]
    details = {
        "no_published_hash_moved_by_extra_key": f"{c['stored_events_checked']} BlockStored checked, "
        f"{c['stored_events_under_extra_key']} under an extra key, {c['stored_events_wrong']} wrong",
        "storage_never_served_across_namespaces": f"{c['content_errors']} pages with another namespace's content",
        "router_index_equals_worker_caches": "index == union of published_copies()"
        + (f"; differs for {', '.join(c['index_mismatched_workers'])}" if c["index_mismatched_workers"] else ""),
        "injected_faults_observed": f"{t['batches_replayed']} batches replayed, {_plural(t['restarts_detected'], 'restart')} seen by the router",
        "key_mode_detected_per_source": ", ".join(f"{w}: {m}" for w, m in result.get("key_modes", {}).items()),
    }
    probe = result.get("vllm_probe")
    if probe:
        mp = probe["matched_pages"]
        details["vllm_prefix_found_as_on_contract_worker"] = (
            f"{probe['pages']}-page salted LoRA prompt: {probe['contract_worker']} {mp['prefix']['contract']} pages, "
            f"{probe['vllm_worker']} {mp['prefix']['vllm']} (longer request: {mp['longer']['contract']} / {mp['longer']['vllm']})"
        )
    return details


def verdict(result: dict[str, Any]) -> str:
    """The closing line: how many checks passed (and which failed)."""
    checks = result["checks"]
    passed = sum(1 for ok in checks.values() if ok)
    line = f"{passed}/{len(checks)} checks passed"
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        line += f"; failed: {', '.join(failed)}"
    if result.get("interrupted"):
        line += f" (interrupted after {result['duration_s']:.1f} s)"
    return line


def _reproducibility(result: dict[str, Any]) -> str:
    if result.get("reproducible"):
        return (
            f"Reproducible: --seed {result['seed']} --requests {result['requests_asked']} gives the same requests, "
            "policy figures, contract counts and events published; timings, batch counts and replays vary."
        )
    return "A time-bound run: its figures vary from run to run; --requests N gives a reproducible one."
