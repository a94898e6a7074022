"""Rich rendering of the demo: a progress line while it runs, then the result tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["DemoProgress", "render_result", "check_details"]

_POLICY_LABELS = {"prefix": "prefix router (served)", "random": "random (shadow cluster)", "round_robin": "round-robin (shadow cluster)"}


class DemoProgress:
    """A rich progress bar over the run's duration with live hit rates (a context manager)."""

    def __init__(self, duration: float, console: Console) -> None:
        self.duration = duration
        self.progress = Progress(
            TextColumn("[bold]demo[/]"),
            BarColumn(bar_width=20),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task("run", total=duration, info="starting")

    def __enter__(self) -> "DemoProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, elapsed: float, figures: dict[str, Any]) -> None:
        info = (
            f"{figures['requests']} req  cache hit: prefix {figures['prefix']:.0%} "
            f"random {figures['random']:.0%} rr {figures['round_robin']:.0%}"
        )
        self.progress.update(self.task, completed=min(elapsed, self.duration), info=info)


def render_result(result: dict[str, Any], console: Console) -> None:
    """The final tables: transport, policies, contract checks."""
    t = result["transport"]
    engines = result.get("engines", {})
    n_vllm = sum(1 for e in engines.values() if e == "vllm")
    fleet = f" ({result['workers'] - n_vllm} contract + {n_vllm} vLLM 0.33)" if n_vllm else ""
    head = Table(title=f"kvevents demo: {result['workers']} workers{fleet}, {result['requests']} requests in "
                 f"{result['duration_s']:.1f}s, seed {result['seed']}")
    head.add_column("transport")
    head.add_column("value", justify="right")
    faults = result["faults"]
    rows = [
        ("events published", t["events_published"]),
        ("events applied by the router (snapshots incl.)", t["events_applied"]),
        ("batches published (heartbeats incl.)", t["batches_published"]),
        ("batches applied live / replay / snapshot", " / ".join(str(t["batches_applied"].get(k, 0)) for k in ("live", "replay", "snapshot"))),
        (f"frames dropped live (injected on {faults['drop_worker']})", faults["dropped_live"]),
        ("gaps detected / healed by replay", f"{t['gaps_detected']} / {t['gaps_healed_by_replay']}"),
        (f"restarts detected (injected on {faults['restart_worker']})", t["restarts_detected"]),
        ("resyncs by snapshot", t["resyncs_by_snapshot"]),
        ("state losses (no snapshot)", t["losses"]),
        ("router caught up after the run in", f"{t['settle_s']:.2f}s"),
    ]
    for name, value in rows:
        head.add_row(name, str(value))
    console.print(head)

    pol = Table(
        title="routing policies (same requests, each policy on its own cluster)",
        caption="cache hit = prompt tokens found on the chosen worker's device cache; prefill saved also counts "
        "pages loaded from the shared storage tier instead of recomputed",
    )
    for col in ("policy", "device cache hit rate", "storage loads", "prefill tokens saved", "load max/mean"):
        pol.add_column(col, justify="left" if col == "policy" else "right")
    for name, p in result["policies"].items():
        pol.add_row(
            _POLICY_LABELS.get(name, name),
            f"{p['device_hit_rate']:.1%}",
            f"{p['storage_hit_rate']:.1%}",
            f"{p['prefill_tokens_saved']:,} / {p['prompt_tokens']:,} ({p['hit_rate_incl_storage']:.0%})",
            f"{p['load_max_over_mean']:.2f}",
        )
    console.print(pol)

    details = check_details(result)
    chk = Table(title="live contract checks")
    chk.add_column("check")
    chk.add_column("result")
    chk.add_column("detail")
    for name, ok in result["checks"].items():
        chk.add_row(name, "[green]PASS[/]" if ok else "[red]FAIL[/]", details.get(name, ""))
    console.print(chk)


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
        "injected_faults_observed": f"{t['batches_replayed']} batches replayed, {t['restarts_detected']} restarts seen by the router",
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
