"""The scale curve of bench_peer.py: kvevents and Dynamo's radix tree side by side at each fleet size.

    python3 benchmarks/bench_peer.py --scale [--points 64x1M,256x1M,1024x1M,4096x1M,1024x10M]
        [--rounds 3] [--cpu 1] [--peer-python PY] [--out benchmarks/scale]

Each point (workers x copies of bench_consumers' shared profile) is one bench_peer.py run in a
process of its own (so one point's memory is gone before the next), both sides pinned to one CPU
and taking turns round by round (`--rounds` each; a p99 is the median of the rounds'). The largest point's
batches are also written as a record log, and a cold start of a router's index from it is timed
(`kvevents log index`, its wall time and peak RSS), then from JetStream (`kvevents route --nats`,
benchmarks/peer_coldstart.py: every batch since seq 0, and as a fleet's bridge leaves the stream),
with the RSS of the route holding the index. Writes results.json, one SVG per figure
against the worker count (benchmarks/svg_plot.py) and prints the figures as a Markdown table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peer_coldstart import cold_start_nats
from svg_plot import line_chart

__all__ = ["run_scale", "parse_points", "cold_start"]

HERE = Path(__file__).resolve().parent
DEFAULT_POINTS = "64x1M,256x1M,1024x1M,4096x1M,1024x10M"
_BIG = 10_000_000  # points this big are plotted apart (a labelled ring)


def parse_points(text: str) -> list[tuple[int, int]]:
    """'64x1M,1024x10M' -> [(64, 1_000_000), (1024, 10_000_000)]."""
    out = []
    for part in text.split(","):
        w, c = part.lower().split("x")
        mult = {"k": 1_000, "m": 1_000_000}.get(c[-1:], 1)
        out.append((int(w), int(float(c.rstrip("km")) * mult)))
    return out


def run_point(workers: int, copies: int, rounds: int, args, log: str | None) -> dict:
    """One bench_peer.py run (its --json report)."""
    cmd = [sys.executable, str(HERE / "bench_peer.py"), "--workers", str(workers), "--copies", str(copies)]
    cmd += ["--rounds", str(rounds), "--cpu", str(args.cpu), "--no-fallback", "--json"]
    if args.peer_python:
        cmd += ["--peer-python", args.peer_python]
    if log:
        cmd += ["--record-log", log]
    t0 = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if run.returncode:
        raise RuntimeError(f"bench_peer.py failed at {workers}x{copies}: {run.stderr[-2000:]}")
    report = json.loads(run.stdout)
    report["wall_s"] = round(time.monotonic() - t0, 1)
    return report


#: Runs argv[2:] and writes its ru_maxrss (KiB) to the file argv[1]. A child's ru_maxrss starts at
#: its parent's resident size at fork (Linux keeps the larger across exec), so the timed command is
#: forked from this small process, never from a benchmark holding a built index.
_LAUNCHER = (
    "import os, subprocess, sys\n"
    "proc = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(proc.pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def cold_start(log: str) -> dict:
    """`kvevents log index LOG --json` in a child process: wall seconds, its own apply seconds, and
    its peak RSS (its own ru_maxrss, via _LAUNCHER, whatever this process holds)."""
    cmd = [sys.executable, "-m", "kvevents", "log", "index", log, "--json"]
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        peak_path = os.path.join(tmp, "maxrss")
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", _LAUNCHER, peak_path, *cmd], stdout=fo, stderr=fe, check=False)
        wall = time.monotonic() - t0
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
        peak_kib = int(Path(peak_path).read_text() or 0) if os.path.exists(peak_path) else 0
    if proc.returncode:
        raise RuntimeError(f"log index failed: {err.decode()[-2000:]}")
    summary = json.loads(out)
    return {
        "command": "kvevents log index LOG --json",
        "log_bytes": os.path.getsize(log),
        "records": summary["records"],
        "copies": summary["copies"],
        "entries": summary["entries"],
        "wall_s": round(wall, 2),
        "apply_s": summary["seconds"],
        "peak_rss_bytes": peak_kib * 1024,
    }


def _row(w: int, c: int, rep: dict) -> dict:
    ours, peer = rep["kvevents_c"], rep.get("dynamo")
    peer = peer if isinstance(peer, dict) else {}
    return {
        "workers": w,
        "copies": c,
        "apply": (ours["apply_copies_per_s_median"], peer.get("apply_copies_per_s_median")),
        "apply_cpu": (ours["apply_copies_per_cpu_s_median"], peer.get("apply_copies_per_cpu_s_median")),
        "lookup_cpu_p50": (ours["lookup_cpu_p50_median_us"], peer.get("lookup_cpu_p50_median_us")),
        "lookup_cpu_p99": (ours["lookup_cpu_p99_median_us"], peer.get("lookup_cpu_p99_median_us")),
        "lookup_p50": (ours["lookup_p50_median_us"], peer.get("lookup_p50_median_us")),
        "lookup_p99": (ours["lookup_p99_median_us"], peer.get("lookup_p99_median_us")),
        # the lookup /score runs (match_columns: arrays, no object per worker) against the peer's lookup
        "columns_cpu_p50": (ours.get("lookup_columns_cpu_p50_median_us"), peer.get("lookup_cpu_p50_median_us")),
        "columns_cpu_p99": (ours.get("lookup_columns_cpu_p99_median_us"), peer.get("lookup_cpu_p99_median_us")),
        # the lookup with an object per matched worker on both sides (PrefixMatch; OverlapScores.scores)
        "objects_cpu_p50": (ours["lookup_cpu_p50_median_us"], peer.get("lookup_scores_cpu_p50_median_us")),
        "objects_cpu_p99": (ours["lookup_cpu_p99_median_us"], peer.get("lookup_scores_cpu_p99_median_us")),
        "full_p50": (ours["full_p50_median_us"], peer.get("full_p50_median_us")),
        "answer_p50": ours.get("answer_p50_median_us"),
        "answer_packed_p50": ours.get("answer_packed_p50_median_us"),
        "bytes": (ours["traced_bytes_per_copy"], ours["rss_bytes_per_copy"], peer.get("rss_bytes_per_copy")),
        "identical": rep.get("identical_matches"),
    }


def _num(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def table(rows: list[dict]) -> str:
    """The figures as a Markdown table (kvevents / Dynamo per cell)."""
    head = (
        "| workers x copies | apply, copies/s: wall | per CPU s | lookup p50 (us): wall | CPU "
        "| lookup p99 (us): wall | CPU | /score's lookup, CPU p50 | p99 "
        "| objects per worker both sides, CPU p50 | p99 | full request p50 (us) "
        "| router's whole answer p50 (us): from a list | from packed ids "
        "| bytes per held copy (traced, RSS / Dynamo RSS) | identical matches |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        cells = [f"{r['workers']:,} x {r['copies'] / 1e6:g}M"]
        for key in ("apply", "apply_cpu"):
            a = r[key]
            cells.append(f"{a[0] / 1e3:,.0f}k / {_num(a[1] and a[1] / 1e3, '{:,.0f}')}k")
        for key in ("lookup_p50", "lookup_cpu_p50", "lookup_p99", "lookup_cpu_p99", "columns_cpu_p50"):
            cells.append(f"{_num(r[key][0], '{}')} / {_num(r[key][1], '{}')}")
        for key in ("columns_cpu_p99", "objects_cpu_p50", "objects_cpu_p99", "full_p50"):
            cells.append(f"{_num(r[key][0], '{}')} / {_num(r[key][1], '{}')}")
        b = r["bytes"]
        cells += [
            _num(r["answer_p50"], "{}"),
            _num(r["answer_packed_p50"], "{}"),
            f"{b[0]:.1f}, {b[1]:.1f} / {_num(b[2], '{:.1f}')}",
            r["identical"] or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def plots(rows: list[dict], out: Path) -> list[str]:
    """One SVG per figure against the worker count (the 10M-copy point as a labelled ring)."""
    made = []
    figures = [
        ("apply", "apply, copies/s (wall)", "copies/s", lambda r: r["apply"], False, None),
        ("apply_cpu", "apply, copies per CPU second", "copies/s", lambda r: r["apply_cpu"], False, None),
        ("lookup_cpu_p99", "lookup p99, process CPU time", "us", lambda r: r["lookup_cpu_p99"], True, None),
        ("columns_cpu_p99", "/score's lookup (columns) p99 vs the peer's lookup, CPU time", "us",
         lambda r: r["columns_cpu_p99"], True, None),
        ("objects_cpu_p99", "lookup with an object per matched worker, p99 CPU (PrefixMatch / OverlapScores.scores)",
         "us", lambda r: r["objects_cpu_p99"], True, None),
        ("lookup_p99", "lookup p99 (hashes given)", "us", lambda r: r["lookup_p99"], True, None),
        ("lookup_p50", "lookup p50 (hashes given)", "us", lambda r: r["lookup_p50"], True, None),
        ("bytes", "bytes per held copy", "bytes", lambda r: (r["bytes"][0], r["bytes"][2]), False, (40.0, "40 B target")),
        ("answer_p50", "router's whole answer p50 (kvevents) vs full request p50 (Dynamo)", "us",
         lambda r: (r["answer_p50"], r["full_p50"][1]), True, None),
        ("answer_packed_p50", "router's whole answer from packed ids p50 (kvevents) vs full request p50 (Dynamo)",
         "us", lambda r: (r["answer_packed_p50"], r["full_p50"][1]), True, None),
    ]  # fmt: skip
    for name, title, unit, get, log_y, limit in figures:
        series: dict[str, list[tuple[float, float]]] = {"kvevents": [], "Dynamo 1.6.1": []}
        extra: dict[str, list[tuple[float, float, str]]] = {"kvevents": [], "Dynamo 1.6.1": []}
        for r in rows:
            for side, v in zip(series, get(r)):
                if v is None:
                    continue
                if r["copies"] >= _BIG:
                    extra[side].append((r["workers"], v, f"{r['copies'] / 1e6:g}M copies"))
                else:
                    series[side].append((r["workers"], v))
        path = out / f"scale_{name}.svg"
        line_chart(path, title, unit, {k: v for k, v in series.items() if v}, extra, log_y=log_y, limit=limit)
        made.append(str(path))
    return made


def run_scale(args) -> None:
    """The whole curve: every point, the cold start of the largest, results.json, SVGs, the table."""
    points = parse_points(args.points or DEFAULT_POINTS)
    out = Path(args.out or HERE / "scale")
    out.mkdir(parents=True, exist_ok=True)
    largest = max(points, key=lambda p: p[1] * 10_000 + p[0])
    results: dict = {"points": [], "config": {"cpu": args.cpu, "rounds": args.rounds, "peer": args.peer_python}}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w, c in points:
            log = os.path.join(tmp, "largest.kvlog") if (w, c) == largest else None
            rep = run_point(w, c, args.rounds, args, log)
            results["points"].append(rep)
            rows.append(_row(w, c, rep))
            print(f"{w}x{c}: done in {rep['wall_s']} s", file=sys.stderr, flush=True)
            if log:
                results["cold_start"] = {"workers": w, **cold_start(log)}
                for via, key in (("log", "cold_start_nats"), ("bridge", "cold_start_nats_bridge")):
                    try:
                        results[key] = {"workers": w, **cold_start_nats(log, via, results["cold_start"]["copies"])}
                    except RuntimeError as exc:  # a fill that failed (the bridge path's engines under load)
                        results[key] = {"workers": w, "error": str(exc)[-2000:]}
    results["rows"] = rows
    results["svgs"] = plots(rows, out)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(table(rows))
    if "cold_start" in results:
        cs = results["cold_start"]
        print(
            f"cold start ({cs['workers']} workers, {cs['copies']:,} copies, {cs['records']:,} records, "
            f"{cs['log_bytes'] / 1e6:.0f} MB log): {cs['wall_s']} s wall ({cs['apply_s']} s reading and applying), "
            f"peak RSS {cs['peak_rss_bytes'] / 1e6:,.0f} MB"
        )
    for key, how in (("cold_start_nats", "every batch"), ("cold_start_nats_bridge", "bridge snapshots + tail")):
        cn = results.get(key)
        if cn and "error" in cn:
            print(f"cold start from JetStream ({how}): failed: {cn['error'][-300:]}")
        elif cn:
            print(
                f"cold start from JetStream ({how}; {cn['workers']} workers, {cn['copies']:,} copies, "
                f"{cn['messages']:,} messages, {cn['stream_bytes'] / 1e6:.0f} MB stream; `{cn['command']}`): "
                f"{cn['wall_s']} s wall, RSS {cn['rss_bytes'] / 1e6:,.0f} MB holding it, "
                f"peak {cn['peak_rss_bytes'] / 1e6:,.0f} MB"
            )
