"""`kvevents demo --html FILE`: the demo's story as one self-contained page (inline SVG, no script,
no external URL): hit rate over time per routing policy, the faults against the router's backlog,
lag and repairs, the policy and transport figures, and the live contract checks.

`line_chart` draws one SVG chart from layers (`_y_axis`, `_x_axis`, `_fault_marks`, `_path_data`,
`_legend`) on a shared `_Frame` (data to pixels); `render_report` assembles the page from `_head`,
`_charts` and the tables (`_policy_table`, `_marks_table`, `_transport_table`, `_checks_table`)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from kvevents.demo.render import check_details

__all__ = ["render_report", "line_chart"]

COLORS = {"prefix": "#2f5fb3", "random": "#c0392b", "round_robin": "#8e6c00"}
LABELS = {"prefix": "prefix router", "random": "random", "round_robin": "round-robin"}
MARK_COLORS = {"drop": "#a15c00", "restart": "#b3261e"}
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 860, 240, 56, 16, 14, 34


def _e(v: Any) -> str:
    """`v` as text safe inside HTML and attribute values."""
    return html.escape(str(v), quote=True)


def _step(span: float, n: int) -> float:
    """A round tick step (1, 2, 2.5 or 5 x 10^k) giving about `n` ticks over `span`."""
    raw = max(span, 1e-12) / n
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)


def _ticks(top: float, n: int = 4) -> list[float]:
    """Round tick values from 0 up to `top` (about `n` steps)."""
    step = _step(top, n)
    return [round(i * step, 10) for i in range(int(top / step + 1e-9) + 1)]


def _y_top(series: dict[str, list[tuple[float, float | None]]], y_max: float | None) -> float:
    """The y axis ceiling: `y_max` when given, else a round value just above the data."""
    if y_max is not None:
        return y_max
    ys = [y for pts in series.values() for _, y in pts if y is not None]
    peak = max(ys + [0.0]) or 1.0
    unit = _step(peak * 1.05, 4)
    return unit * math.ceil(peak * 1.05 / unit)


@dataclass(frozen=True)
class _Frame:
    """The plot area's mapping from data (seconds, value) to SVG pixels, shared by every layer."""

    x_max: float
    top: float

    def px(self, x: float) -> float:
        """The pixel column of `x` seconds."""
        return PAD_L + (W - PAD_L - PAD_R) * x / self.x_max

    def py(self, y: float) -> float:
        """The pixel row of value `y` (clipped at the top of the axis)."""
        return PAD_T + (H - PAD_T - PAD_B) * (1 - min(y, self.top) / self.top)


def _y_axis(fr: _Frame, percent: bool) -> list[str]:
    """Horizontal grid lines with their labels (percent, plain, or thousands with commas)."""
    out = []
    for t in _ticks(fr.top):
        label = f"{t:.0%}" if percent else (f"{t:g}" if t < 1000 else f"{t:,.0f}")
        out.append(
            f'<line class="grid" x1="{PAD_L}" x2="{W - PAD_R}" y1="{fr.py(t):.1f}" y2="{fr.py(t):.1f}"/>'
            f'<text class="yt" x="{PAD_L - 6}" y="{fr.py(t) + 4:.1f}">{label}</text>'
        )
    return out


def _x_axis(fr: _Frame) -> list[str]:
    """The seconds ticks under the plot and the axis caption."""
    out = [f'<text class="xt" x="{fr.px(t):.1f}" y="{H - PAD_B + 16}">{t:g}s</text>' for t in _ticks(fr.x_max, 8)]
    out.append(f'<text class="axis" x="{PAD_L}" y="{H - 4}">seconds since the traffic started</text>')
    return out


def _fault_marks(fr: _Frame, marks: Sequence[dict[str, Any]]) -> list[str]:
    """A dashed vertical line per fault, labelled with its kind and worker."""
    out = []
    for m in marks:
        x = fr.px(m["t"])
        color = MARK_COLORS.get(m["kind"], "#555")
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_T}" y2="{H - PAD_B}" stroke="{color}" '
            f'stroke-dasharray="4 3" stroke-width="1.5"/>'
            f'<text class="mark" x="{x + 4:.1f}" y="{PAD_T + 10}" fill="{color}">{_e(m["kind"])} {_e(m["worker"] or "")}</text>'
        )
    return out


def _path_data(fr: _Frame, pts: list[tuple[float, float | None]], step: bool) -> str:
    """The `d` of one series' path: a None value lifts the pen; `step` holds each value until the next."""
    path, pen = [], "M"
    prev_y: float | None = None
    for x, y in pts:
        if y is None:
            pen = "M"
            continue
        if step and prev_y is not None and pen == "L":
            path.append(f"L{fr.px(x):.1f},{fr.py(prev_y):.1f}")
        path.append(f"{pen}{fr.px(x):.1f},{fr.py(y):.1f}")
        pen, prev_y = "L", y
    return " ".join(path)


def _legend(names: Iterable[str], colors: dict[str, str]) -> str:
    """A colour swatch and label per series, for the caption."""
    return "".join(
        f'<span><i style="background:{colors.get(n, "#333")}"></i>{_e(LABELS.get(n, n))}</span>' for n in names
    )


def line_chart(
    series: dict[str, list[tuple[float, float | None]]],
    *,
    x_max: float,
    y_label: str,
    marks: Sequence[dict[str, Any]] = (),
    y_max: float | None = None,
    percent: bool = False,
    colors: dict[str, str] | None = None,
    step: bool = False,
) -> str:
    """An SVG line chart (x: seconds of the run), vertical fault marks, a y axis with a few ticks."""
    colors = colors or {}
    fr = _Frame(x_max=max(x_max, 1e-9), top=_y_top(series, y_max))
    out = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{_e(y_label)}" class="chart">']
    out += _y_axis(fr, percent) + _x_axis(fr) + _fault_marks(fr, marks)
    for name, pts in series.items():
        out.append(
            f'<path d="{_path_data(fr, pts, step)}" fill="none" stroke="{colors.get(name, "#333")}" stroke-width="2" '
            f'data-series="{_e(name)}"/>'
        )
    out.append("</svg>")
    legend = _legend(series, colors)
    return f'<figure>{"".join(out)}<figcaption>{_e(y_label)}<span class="legend">{legend}</span></figcaption></figure>'


def _hit_series(samples: list[dict[str, Any]], window: int = 4) -> dict[str, list[tuple[float, float | None]]]:
    """Device cache hit rate per policy over a sliding window of `window` sample intervals."""
    out: dict[str, list[tuple[float, float | None]]] = {}
    for name in samples[0]["hits"] if samples else ():
        pts: list[tuple[float, float | None]] = []
        for i, s in enumerate(samples):
            j = max(0, i - window)
            hit = s["hits"][name][0] - samples[j]["hits"][name][0]
            tok = s["hits"][name][1] - samples[j]["hits"][name][1]
            pts.append((s["t"], hit / tok if tok else None))
        out[name] = pts
    return out


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """An HTML table: escaped headings, cells inserted as given (callers escape what needs it)."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _charts(samples: list[dict[str, Any]], marks: list[dict[str, Any]], x_max: float) -> dict[str, str]:
    """The page's four charts on one time axis: hit rate per policy, backlog, lag and repairs."""
    rep_colors = {"replayed": "#2f5fb3", "gaps": "#8e6c00", "restarts": "#b3261e", "snapshots_applied": "#6a3fb3"}
    return {
        "hit": line_chart(
            _hit_series(samples),
            x_max=x_max,
            y_max=1.0,
            percent=True,
            marks=marks,
            colors=COLORS,
            y_label="device cache hit rate per routing policy (sliding window)",
        ),
        "behind": line_chart(
            {"behind": [(s["t"], s["behind"]) for s in samples]},
            x_max=x_max,
            marks=marks,
            colors={"behind": "#2f5fb3"},
            y_label="batches published but not yet applied by the router",
            step=True,
        ),
        "lag": line_chart(
            {"lag": [(s["t"], s["lag_ms"]) for s in samples]},
            x_max=x_max,
            marks=marks,
            colors={"lag": "#1c7c4d"},
            y_label="router lag, ms (receive time minus batch time, last live batch)",
        ),
        "repairs": line_chart(
            {k: [(s["t"], s["repairs"][k]) for s in samples] for k in rep_colors},
            x_max=x_max,
            marks=marks,
            colors=rep_colors,
            step=True,
            y_label="router's repairs (cumulative): replayed batches, gaps, restarts, snapshots",
        ),
    }


def _policy_table(result: dict[str, Any]) -> str:
    """Per routing policy: hit rates, prefill tokens saved and the load spread."""
    rows = [
        [
            _e(LABELS.get(n, n)),
            f"{p['device_hit_rate']:.1%}",
            f"{p['storage_hit_rate']:.1%}",
            f"{p['prefill_tokens_saved']:,} / {p['prompt_tokens']:,}",
            f"{p['load_max_over_mean']:.2f}",
        ]
        for n, p in result["policies"].items()
    ]
    head = ["policy", "device cache hit rate", "storage loads", "prefill tokens saved", "load max/mean"]
    return _table(head, rows)


def _transport_table(result: dict[str, Any]) -> str:
    """What the transport did under the faults: events, drops, gaps, replays, restarts, resyncs."""
    t, f = result["transport"], result["faults"]
    rows = [
        ["events published / applied", f"{t['events_published']:,} / {t['events_applied']:,}"],
        [f"frames dropped live (on {_e(f['drop_worker'])})", f["dropped_live"]],
        ["gaps detected / healed by replay", f"{t['gaps_detected']} / {t['gaps_healed_by_replay']}"],
        ["batches replayed", t["batches_replayed"]],
        [f"restarts detected (injected on {_e(f['restart_worker'])})", t["restarts_detected"]],
        ["resyncs by snapshot", t["resyncs_by_snapshot"]],
        ["state losses (no snapshot)", t["losses"]],
        ["router caught up after the run in", f"{t['settle_s']:.2f} s"],
    ]
    return _table(["transport", "value"], rows)


def _checks_table(result: dict[str, Any]) -> str:
    """Each live contract check with PASS/FAIL and what it measured."""
    details = check_details(result)
    rows = [
        [
            f'<span class="{"pass" if ok else "fail"}">{"PASS" if ok else "FAIL"}</span>',
            _e(name),
            _e(details.get(name, "")),
        ]
        for name, ok in result["checks"].items()
    ]
    return _table(["result", "check", "measured"], rows, "checks")


def _marks_table(marks: list[dict[str, Any]]) -> str:
    """The injected faults with their time, or a note when the run was too short for any."""
    rows = [[f"{m['t']:.2f} s", _e(m["kind"]), _e(m["worker"]), _e(m["detail"])] for m in marks]
    return _table(["at", "fault", "worker", "what"], rows) if rows else "<p>no fault was injected (run too short)</p>"


def _title(result: dict[str, Any]) -> str:
    """The page title: the fleet (with its vLLM share), the traffic and the seed."""
    engines = result.get("engines", {})
    n_vllm = sum(1 for e in engines.values() if e == "vllm")
    fleet = f" ({result['workers'] - n_vllm} contract + {n_vllm} vLLM)" if n_vllm else ""
    return (
        f"kvevents demo: {result['workers']} workers{fleet}, {result['requests']:,} requests in "
        f"{result['duration_s']:.1f} s, seed {result['seed']}"
    )


def _head(title: str, ok: bool) -> str:
    """The document head up to `<body>`: title and the inline style sheet (the verdict green or red)."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>
body {{ margin:0 auto; max-width:920px; padding:1rem; font:15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:#1d232b; }}
h1 {{ font-size:1.3rem; }} h2 {{ font-size:1.05rem; margin-top:1.6rem; }}
.verdict {{ font-weight:600; color:{"#1c7c4d" if ok else "#b3261e"}; }}
figure {{ margin:.5rem 0 1rem; }} figcaption {{ color:#5d6875; font-size:.85rem; }}
svg.chart {{ width:100%; height:auto; background:#fafbfc; border:1px solid #dde2e8; border-radius:6px; }}
svg .grid {{ stroke:#e6e9ee; }} svg text {{ font-size:11px; fill:#5d6875; }}
svg .yt {{ text-anchor:end; }} svg .xt {{ text-anchor:middle; }} svg .mark {{ font-size:11px; }}
.legend span {{ margin-left:1rem; white-space:nowrap; }} .legend i {{ display:inline-block; width:.8rem; height:.3rem; margin-right:.3rem; vertical-align:middle; }}
table {{ border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; margin:.3rem 0; }}
th, td {{ text-align:left; padding:.3rem .5rem; border-bottom:1px solid #dde2e8; vertical-align:top; }}
.pass {{ color:#fff; background:#1c7c4d; padding:0 .4rem; border-radius:3px; }} .fail {{ color:#fff; background:#b3261e; padding:0 .4rem; border-radius:3px; }}
.scroll {{ overflow-x:auto; }}
</style></head><body>
"""


def render_report(result: dict[str, Any]) -> str:
    """The whole page for one `run_demo` result (needs its `timeline`)."""
    tl = result.get("timeline") or {"samples": [], "marks": []}
    samples, marks = tl["samples"], tl["marks"]
    x_max = max([s["t"] for s in samples] + [result.get("duration_s", 0.0), 1.0])
    charts = _charts(samples, marks, x_max)
    title = _title(result)
    verdict = "every check passed" if result["ok"] else "a check FAILED"
    checked = result["contract"]["stored_events_checked"]
    return f"""{_head(title, result["ok"])}<h1>{_e(title)}</h1>
<p class="verdict" id="verdict">{verdict}</p>
<p>Every request is routed by the prefix router (the served cluster) and, in shadow, by random and round-robin
policies on clusters of their own. Around 40% of the run one publisher drops a burst of live frames (the router
must see the gap and replay it); around 60% one worker restarts (a new epoch: the router drops its blocks and
resyncs by snapshot). The dashed lines mark both.</p>
<h2>Is routing paying off?</h2>
{charts["hit"]}
<div class="scroll">{_policy_table(result)}</div>
<h2>Faults and recovery</h2>
{_marks_table(marks)}
{charts["behind"]}
{charts["lag"]}
{charts["repairs"]}
<div class="scroll">{_transport_table(result)}</div>
<h2>Live contract checks</h2>
<div class="scroll">{_checks_table(result)}</div>
<p>Figures: {len(samples)} samples every {tl.get("interval_s", 0):g} s; stored BlockStored events checked: {checked:,}.</p>
</body></html>
"""
