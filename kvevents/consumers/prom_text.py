"""Read the samples of a few metric families out of Prometheus' text exposition format (0.0.4, and
the OpenMetrics text an engine may send instead): what the router's load scraper needs, nothing more.

Lines of other families are skipped by their name before their labels are read, so a 100 KB
engine page costs little; a malformed line of a wanted family is counted and skipped, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Sample", "parse_samples"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample: its family name, its labels and its value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_samples(text: str, wanted: frozenset[str]) -> tuple[list[Sample], int]:
    """The samples of the `wanted` families in exposition `text`, and how many of their lines
    were malformed (skipped). Comments (# HELP, # TYPE, # EOF) and other families are ignored."""
    out: list[Sample] = []
    bad = 0
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        line = line.strip()
        end = _name_end(line)
        name = line[:end]
        if name not in wanted:
            continue
        got = _sample(name, line, end)
        if got is None:
            bad += 1
        else:
            out.append(got)
    return out, bad


def _name_end(line: str) -> int:
    for i, ch in enumerate(line):
        if ch == "{" or ch == " " or ch == "\t":
            return i
    return len(line)


def _sample(name: str, line: str, at: int) -> Sample | None:
    labels: dict[str, str] = {}
    if at < len(line) and line[at] == "{":
        got = _labels(line, at + 1)
        if got is None:
            return None
        labels, at = got
    parts = line[at:].split()
    if not parts or len(parts) > 2:  # a value, and maybe a timestamp
        return None
    try:
        value = float(parts[0])  # NaN is a value (engines export it for "not measured yet")
    except ValueError:
        return None
    return Sample(name, labels, value)


def _labels(line: str, i: int) -> tuple[dict[str, str], int] | None:
    """`name="value",...}` from position i: the labels and the position after the brace."""
    labels: dict[str, str] = {}
    n = len(line)
    while True:
        while i < n and line[i] in " ,":
            i += 1
        if i < n and line[i] == "}":
            return labels, i + 1
        eq = line.find("=", i)
        if eq < 0 or eq + 1 >= n or line[eq + 1] != '"':
            return None
        key = line[i:eq].strip()
        value, i = _quoted(line, eq + 2)
        if value is None or not key:
            return None
        labels[key] = value


def _quoted(line: str, i: int) -> tuple[str | None, int]:
    """The label value starting at i (after its opening quote), unescaped, and the position after it."""
    buf: list[str] = []
    n = len(line)
    while i < n:
        ch = line[i]
        if ch == '"':
            return "".join(buf), i + 1
        if ch == "\\" and i + 1 < n:
            nxt = line[i + 1]
            buf.append("\n" if nxt == "n" else nxt)
            i += 2
            continue
        buf.append(ch)
        i += 1
    return None, i
