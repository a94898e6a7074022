"""`kvevents demo`: simulated workers publishing on loopback, a prefix router, live contract checks.

The orchestration lives here as a library (`run_demo`) so the CLI only parses flags and renders.
"""

from kvevents.demo.render import DemoProgress, render_result
from kvevents.demo.run import DemoConfig, check_stored_hashes, run_demo

__all__ = ["DemoConfig", "run_demo", "check_stored_hashes", "render_result", "DemoProgress"]
