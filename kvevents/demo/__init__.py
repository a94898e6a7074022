"""`kvevents demo`: simulated workers publishing on loopback, a prefix router, live contract checks.

The orchestration lives here as a library (`run_demo`) so the CLI only parses flags and renders.

| file | what it owns |
|---|---|
| `config.py` | `DemoConfig` and the figures a seeded `--requests N` run repeats |
| `run.py` | `run_demo`: the run step by step (start, traffic with two faults, settle, result) |
| `steps.py` | the run's moves on publishers and router: publish, restart, drop, wait, route, compare, probe |
| `cluster.py` | the simulated clusters, policies and the load bound |
| `timeline.py` | samples over the run for the HTML report |
| `render.py` | the terminal rendering and the progress bar |
| `report.py` | the self-contained HTML report |
"""

from kvevents.demo.render import DemoProgress, render_result
from kvevents.demo.run import DemoConfig, check_stored_hashes, run_demo

__all__ = ["DemoConfig", "run_demo", "check_stored_hashes", "render_result", "DemoProgress"]
