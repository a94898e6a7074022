"""Line charts as SVG in plain Python (no plotting library): one figure against the worker count.

Used by benchmarks/peer_scale.py for the scale curve of bench_peer.py. A chart has a log2 x axis
(workers), a linear or log10 y axis, one polyline per series, and extra labelled points (e.g. the
10M-copy point) drawn as rings beside the lines.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

__all__ = ["line_chart"]

_W, _H = 560, 340
_LEFT, _RIGHT, _TOP, _BOTTOM = 78, 150, 40, 50
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b"]

Point = tuple[float, float]


def _nice_ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:  # 1, 2, 5 per decade (1 and 3 past three decades)
        steps = (1, 2, 5) if math.log10(hi / lo) <= 3 else (1, 3)
        return [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in steps]
    step = 10 ** math.floor(math.log10((hi - lo) or 1))
    for mult in (1, 2, 5, 10):
        if (hi - lo) / (step * mult) <= 6:
            step *= mult
            break
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 2)]


def _fmt(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def line_chart(
    path: str | Path,
    title: str,
    ylabel: str,
    series: dict[str, list[Point]],
    extra: dict[str, list[tuple[float, float, str]]] | None = None,
    *,
    log_y: bool = False,
    limit: tuple[float, str] | None = None,
) -> None:
    """Write `series` (name -> [(workers, value)]) as an SVG line chart at `path`; `extra` adds
    labelled rings per series name, `limit` a dashed horizontal line (value, label)."""
    extra = extra or {}
    xs = [x for pts in series.values() for x, _ in pts] + [x for pts in extra.values() for x, _, _ in pts]
    ys = [y for pts in series.values() for _, y in pts] + [y for pts in extra.values() for _, y, _ in pts]
    if limit:
        ys.append(limit[0])
    ys = [y for y in ys if y > 0] or [1.0]
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    y0, y1 = (min(ys) / 1.5, max(ys) * 1.5) if log_y else (0.0, max(ys) * 1.15)
    fy = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(x: float) -> float:
        return _LEFT + (math.log2(x) - x0) / ((x1 - x0) or 1) * pw

    def py(y: float) -> float:
        return _TOP + ph - (fy(max(y, y0)) - fy(y0)) / ((fy(y1) - fy(y0)) or 1) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<text x="16" y="{_TOP + ph / 2}" transform="rotate(-90 16 {_TOP + ph / 2})" text-anchor="middle">{escape(ylabel)}</text>',
        f'<text x="{_LEFT + pw / 2}" y="{_H - 12}" text-anchor="middle">workers</text>',
    ]
    for t in _nice_ticks(y0 if log_y else 0.0, y1, log_y):
        if y0 <= t <= y1:
            out.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{_LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for x in sorted(set(xs)):
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{_TOP}" y2="{_TOP + ph}" stroke="#eee"/>')
        out.append(f'<text x="{px(x):.1f}" y="{_TOP + ph + 18}" text-anchor="middle">{x:,.0f}</text>')
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    if limit:
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{py(limit[0]):.1f}" y2="{py(limit[0]):.1f}" '
            'stroke="#999" stroke-dasharray="5,4"/>'
        )
        out.append(f'<text x="{_LEFT + pw + 6}" y="{py(limit[0]) + 4:.1f}" fill="#666">{escape(limit[1])}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        for x, y, label in extra.get(name, []):
            out.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="6" fill="none" stroke="{color}" stroke-width="2"/>'
            )
            out.append(f'<text x="{px(x) + 9:.1f}" y="{py(y) + 4:.1f}" fill="{color}">{escape(label)}</text>')
        ly = _TOP + 16 + i * 18
        out.append(
            f'<line x1="{_LEFT + pw + 10}" x2="{_LEFT + pw + 30}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{_LEFT + pw + 36}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")
