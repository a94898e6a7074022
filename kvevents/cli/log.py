"""`kvevents log inspect|repair|export|index`: read-only tools over a record log (plus tail repair),
over kvevents.recordlog (stats, verify, repair, export) and kvevents.consumers.indexer (index)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvevents.cli.app import CheckFailed, user_error
from kvevents.cli.output import fits, out_console, print_records, warn_damage
from kvevents.recordlog import LogStats, RecordReader, StatsCollector, VerifyReport, apply_log, iter_jsonl, repair_log
from kvevents.recordlog.verifiers import make_verifier

log_app = typer.Typer(help="Inspect, verify, repair, export and index record logs.", no_args_is_help=True)

MAX_SHOWN = 50


_STRICT_HELP = (
    "Exit 1 when a region of the file was skipped (corrupt or torn): what CI should run. "
    "Without it a skipped region is a warning and the exit code judges the records read."
)


@log_app.command("inspect")
def inspect_cmd(
    file: str = typer.Argument(..., help="Record log file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    verify: bool = typer.Option(False, "--verify", help="Check the contract over the whole log."),
    page_size: Optional[int] = typer.Option(
        None, "--page-size", "-p", help="Tokens per page, for --verify (default: each event's own block_size)."
    ),
    salt: list[str] = typer.Option([], "--salt", help="A cache_salt a chain head may be seeded with (repeatable)."),
    profile: str = typer.Option(
        "contract",
        "--profile",
        help="--verify against: contract, or a vLLM 0.33 stream: vllm "
        "(structure, links), vllm-sha256 | vllm-sha256_cbor (hashes too; PYTHONHASHSEED if set).",
    ),
    lora_path: list[str] = typer.Option(
        [], "--lora-path", help="vLLM profiles: NAME=PATH of a LoRA adapter (repeatable)."
    ),
    strict: bool = typer.Option(False, "--strict", help=_STRICT_HELP),
) -> None:
    """Counts by event type, medium and source; seq gaps and epochs; time span and rates.

    With --verify: parents before children, removes only of live copies, hashes recomputed
    from token_ids; violations are counted by kind, each kind shown with its first example;
    exit 1 if any (and with --strict if a damaged region was skipped).
    """
    if page_size is not None and not verify:
        user_error("--page-size is only used by --verify: add --verify, or leave --page-size out")
    if page_size is not None and page_size < 1:
        user_error(f"--page-size must be >= 1, got {page_size}")
    try:
        verifier = make_verifier(profile, page_size, salt, lora_path) if verify else None
    except ValueError as exc:
        user_error(str(exc))
    stats, report = _read(file, verifier)
    if as_json:
        out = stats.as_dict()
        if report is not None:
            out["verify"] = report.as_dict()
        sys.stdout.write(json.dumps(out) + "\n")
    else:
        _render_stats(stats)
        if report is not None:
            _render_verify(report, strict)
    if report is not None and not report.ok:
        raise CheckFailed(f"{report.violation_count} contract violation(s) in {file}")
    skipped = _skipped(stats.damage)
    if strict and skipped:
        raise CheckFailed(f"{file}: {skipped} skipped unread (--strict)")


def _read(file: str, verifier: Any) -> tuple[LogStats, Optional[VerifyReport]]:
    """One pass over the log: its stats and, with a verifier, its verify report (damage in both)."""
    reader = RecordReader(file, on_damage=warn_damage)
    col = StatsCollector(reader.path, reader.size)
    try:
        for rec in reader:
            col.feed(rec)
            if verifier is not None:
                verifier.feed(rec)
    finally:
        reader.close()
    stats = col.stats
    stats.damage = list(reader.damage)
    report = verifier.report if verifier is not None else None
    if report is not None:
        report.damage = list(reader.damage)
    return stats, report


def _render_stats(st: LogStats) -> None:
    c = out_console()
    _render_totals(c, st)
    if st.media:
        _print_fitted(c, _media_table(st))
    if st.sources:
        _print_fitted(c, _sources_table(st))
    _render_anomalies(c, st)


def _print_fitted(c: Console, table: Table) -> None:
    """A table, or one record per row when it is wider than the console."""
    if fits(c, table):
        c.print(table)
        return
    headers = [str(col.header) for col in table.columns]
    rows = [[str(cell) for cell in col.cells] for col in table.columns]
    print_records(c, str(table.title or ""), headers, list(zip(*rows)))


def _render_totals(c: Console, st: LogStats) -> None:
    r = st.rates()
    c.print(f"[bold]{st.path}[/]: {st.records} records, {st.size} bytes, payload {st.payload_bytes} bytes")
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(st.kinds.items())) or "-"
    c.print(f"kinds: {kinds}")
    clock = (
        f"over the batches' own timestamps ({st.batch_span_s:.3f} s)"
        if st.rate_clock == "batch_ts"
        else "per second of receive time"
    )
    c.print(f"received over {st.duration_s:.3f} s; rates {clock}:", highlight=False)
    c.print(
        f"  {r['records_per_s']:.1f} records/s, {r['events_per_s']:.1f} events/s, "
        f"{r['blocks_per_s']:.1f} blocks/s, {r['bytes_per_s'] / 1e6:.3f} MB/s",
        highlight=False,
    )
    evs = ", ".join(f"{k} {n}" for k, n in sorted(st.event_types.items())) or "-"
    c.print(f"events: {evs}")
    c.print(f"blocks stored {st.blocks.get('stored', 0)}, removed {st.blocks.get('removed', 0)}")
    if st.decode_errors:
        c.print(f"[red]decode errors: {st.decode_errors}[/]")
        for e in st.decode_error_list[:MAX_SHOWN]:
            c.print(f"  record {e['record']} ({e['source']} seq {e['seq']}): {e['error']}")


def _media_table(st: LogStats) -> Table:
    t = Table(title="by medium", show_edge=False, header_style="bold")
    for col in ("medium", "stored events", "stored blocks", "removed events", "removed blocks"):
        t.add_column(col, justify="right" if col != "medium" else "left", no_wrap=True)
    for m, cnt in sorted(st.media.items()):
        t.add_row(
            m, *(str(cnt.get(k, 0)) for k in ("stored_events", "stored_blocks", "removed_events", "removed_blocks"))
        )
    return t


_SOURCE_COLUMNS = (
    "source",
    "endpoint",
    "records",
    "events",
    "heartbeats",
    "stored",
    "removed",
    "clears",
    "seqs",
    "gaps (missing)",
    "resets",
    "epochs",
)


def _sources_table(st: LogStats) -> Table:
    t = Table(title="by source", show_edge=False, header_style="bold")
    for col in _SOURCE_COLUMNS:
        t.add_column(col, no_wrap=True)
    for name, s in st.sources.items():
        seqs = "-" if s.first_seq is None else f"{s.first_seq}..{s.last_seq}"
        t.add_row(
            name,
            ",".join(sorted(s.endpoints)),
            str(s.records),
            str(s.events),
            str(s.heartbeats),
            str(s.stored_blocks),
            str(s.removed_blocks),
            str(s.clears),
            seqs,
            f"{s.gaps} ({s.missing_seqs})",
            str(s.resets),
            ",".join(str(e) for e in s.epochs) or "-",
        )
    return t


def _more(c: Console, shown: list, what: str) -> None:
    if len(shown) > MAX_SHOWN:
        c.print(f"... and {len(shown) - MAX_SHOWN} more {what} (--json lists them all)", highlight=False)


def _render_anomalies(c: Console, st: LogStats) -> None:
    """Gaps, odd seqs, epoch changes, resets (the first MAX_SHOWN of each) and damage."""
    for g in st.gaps[:MAX_SHOWN]:
        c.print(
            f"[yellow]gap[/] record {g['record']} {g['source']} rank {g['dp_rank']}: seq {g['after']} -> "
            f"{g['seq']} ({g['missing']} missing)"
        )
    _more(c, st.gaps, "gaps")
    for g in st.seq_anomalies[:MAX_SHOWN]:
        c.print(f"[yellow]{g['what']} seq[/] record {g['record']} {g['source']}: {g['after']} -> {g['seq']}")
    _more(c, st.seq_anomalies, "odd seqs")
    for g in st.epoch_changes[:MAX_SHOWN]:
        c.print(
            f"[yellow]epoch change[/] record {g['record']} {g['source']}: now {g['epoch']} (seq {g['after']} -> {g['seq']})"
        )
    _more(c, st.epoch_changes, "epoch changes")
    for g in st.resets[:MAX_SHOWN]:
        c.print(f"reset record {g['record']} {g['source']} rank {g['dp_rank']}: {g['reason']}")
    _more(c, st.resets, "resets")
    for d in st.damage:
        c.print(f"[red]damage[/] {d.kind}: {d.length} bytes at offset {d.offset}")


def _page_size_words(rep: VerifyReport) -> str:
    if rep.page_size_given:
        return f"page size {rep.page_size}"
    sizes = ", ".join(str(k) for k in sorted(rep.block_sizes)) or "-"
    return f"page size {sizes} (the events' block_size)"


def _render_verify(rep: VerifyReport, strict: bool) -> None:
    c = out_console()
    c.print(f"[bold]verify[/] {_page_size_words(rep)}: {rep.events} events", highlight=False)
    c.print(f"  {rep.blocks_verified} blocks verified, {rep.blocks_unverifiable} unverifiable", highlight=False)
    heads = ", ".join(f"{k} {n}" for k, n in sorted(rep.heads.items())) or "-"
    c.print(f"  chain heads: {heads}", highlight=False)
    if rep.parents_unchecked or rep.removes_unchecked:
        c.print(
            f"  unchecked (state unknown): {rep.parents_unchecked} parents, {rep.removes_unchecked} removes",
            highlight=False,
        )
    for code, count, first in rep.grouped():  # one line per kind: a wrong page size breaks every event
        line = str(first) if count == 1 else f"{code} x{count}, the first at {first.where()}: {first.message}"
        c.print(f"violation {line}", markup=False, highlight=False)
    skipped = _skipped(rep.damage)
    if rep.ok and skipped:
        c.print(
            f"[yellow]verify: no contract violation in the records read, but {skipped} were skipped "
            + ("unchecked: exit 1 (--strict)[/]" if strict else "unchecked (exit 0; --strict makes it 1)[/]")
        )
    elif rep.ok:
        c.print("[green]verify: OK, no contract violation[/]")
    else:
        kinds = ", ".join(f"{code} {count}" for code, count, _ in rep.grouped())
        c.print(f"[red]verify: {rep.violation_count} violation(s): {kinds}[/]", highlight=False)


def _skipped(damage: list) -> str:
    """'1 corrupt region (83 bytes at offset 1234)' style summary of damage a reader skipped."""
    parts = []
    for kind, label in (("corrupt", "corrupt region"), ("torn", "torn tail")):
        ds = [d for d in damage if d.kind == kind]
        if ds:
            where = ", ".join(f"{d.length} bytes at offset {d.offset}" for d in ds[:3]) + (
                ", ..." if len(ds) > 3 else ""
            )
            parts.append(f"{len(ds)} {label}{'s' if len(ds) > 1 else ''} ({where})")
    return " and ".join(parts)


@log_app.command("repair")
def repair_cmd(
    file: str = typer.Argument(..., help="Record log file to repair in place (not a symbolic link)."),
    drop_corrupt: bool = typer.Option(False, "--drop-corrupt", help="Also rewrite the file without corrupt regions."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only report what would be cut."),
) -> None:
    """Truncate a torn last record (crash mid-write); corrupt regions are reported (or dropped).

    A FILE that is a symbolic link is refused (exit 2; --dry-run still reports): repair changes the
    file in place, so following the link would change a file you did not name, and --drop-corrupt
    would replace the link with a regular file. Run it on the link's target instead.
    """
    res = repair_log(file, drop_corrupt=drop_corrupt, dry_run=dry_run)
    c = out_console()
    verb = "would cut" if dry_run else "cut"
    if res.header_damaged:
        c.print(f"{file}: damaged file header " + ("would be rewritten" if dry_run else "rewritten"))
    if res.torn_bytes:
        c.print(
            f"{file}: {verb} a torn tail of {res.torn_bytes} bytes; {res.records} valid records kept "
            f"({res.size_before} -> {res.size_after} bytes)"
        )
    for d in res.corrupt:
        what = "dropped" if res.rewritten else "kept (readers skip it; --drop-corrupt rewrites)"
        c.print(f"{file}: corrupt region of {d.length} bytes at offset {d.offset}: {what}")
    if not res.torn_bytes and not res.corrupt and not res.header_damaged:
        c.print(f"{file}: clean, {res.records} records, nothing to repair")


@log_app.command("export")
def export_cmd(
    file: str = typer.Argument(..., help="Record log file."),
    jsonl: bool = typer.Option(
        False, "--jsonl", help="Name the format: JSON lines, the default and so far the only one."
    ),
    payload: bool = typer.Option(False, "--payload", help="Include the exact payload bytes as base64."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Export records with decoded events as JSON lines (the default format), for other tools."""
    lines = iter_jsonl(file, payload=payload, on_damage=warn_damage)
    if output is None:
        w = sys.stdout.buffer
        try:
            for line in lines:
                w.write(line)
            w.flush()
        except BrokenPipeError:  # `... | head`: the reader has enough, not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    else:
        with open(output, "wb") as f:
            for line in lines:
                f.write(line)


@log_app.command("index")
def index_cmd(
    file: str = typer.Argument(..., help="Record log to read."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Rebuild a BlockIndex offline from a log (resets applied) and print what it holds."""
    from kvevents.consumers.indexer import BlockIndex

    index = BlockIndex()
    res = apply_log(file, index.apply, lambda src, rank: index.drop_source(src, rank), on_damage=warn_damage)
    n, resets, bad, el = res.records, res.resets, res.decode_errors, res.seconds
    summary = {
        "file": file,
        "records": n,
        "resets": resets,
        "decode_errors": bad,
        "seconds": round(el, 4),
        "copies": len(index),
        "entries": index.distinct_hashes,
        "workers": index.block_counts(),
        "media": index.medium_counts(),
        "counters": index.stats(),
    }
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    c = out_console()
    c.print(
        f"rebuilt a BlockIndex from {file}: {n} records ({resets} resets, {bad} undecodable) in {el:.3f}s",
        highlight=False,
    )
    c.print(
        f"{len(index)} block copies, {index.distinct_hashes} distinct hashes, media: "
        + (", ".join(f"{m} {k}" for m, k in sorted(index.medium_counts().items())) or "-"),
        highlight=False,
    )
    for label, per in index.block_counts().items():
        c.print(
            f"  {label}: " + (", ".join(f"{m} {k}" for m, k in sorted(per.items())) or "no blocks"), highlight=False
        )
    sizes = ("copies", "entries", "workers", "batches", "table_bytes", "table_paged_bytes")
    odd = {k: v for k, v in index.stats().items() if k not in sizes and v}
    if odd:
        c.print("counters: " + ", ".join(f"{k} {v}" for k, v in sorted(odd.items())), highlight=False)
