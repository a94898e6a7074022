"""Helpers shared by the CLI commands: consoles, one-line warnings on stderr, check tables."""

from __future__ import annotations

import logging
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from kvevents.recordlog import Damage

CHECK_MARKS = {"ok": "[green]✓ ok[/]", "fail": "[red]✗ FAIL[/]", "warn": "[yellow]! warn[/]", "skip": "[dim]- skip[/]"}


def out_console() -> Console:
    """A stdout console that does not wrap long lines when piped."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    return console


def err_console() -> Console:
    return Console(stderr=True)


def warn_damage(d: Damage) -> None:
    """on_damage callback for the CLI: one warning line on stderr."""
    sys.stderr.write(f"kvevents: warning: {d.message()}\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    sys.stderr.write(f"kvevents: warning: {' '.join(message.split())}\n")
    sys.stderr.flush()


def log_to_stderr() -> None:
    """Library warnings (stale sources, losses, NATS disconnects) as one-line `kvevents: WARNING:` messages."""
    logger = logging.getLogger("kvevents")
    if not logger.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("kvevents: %(levelname)s: %(message)s"))
        logger.addHandler(h)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def print_checks(title: str, checks: list[Any]) -> None:
    """A doctor report (checks with name, status, detail, hint) as a table, then a hint line per
    failed or warned check."""
    c = out_console()
    t = Table(title=title, show_edge=False, header_style="bold", show_lines=False)
    t.add_column("check", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("details")
    for ch in checks:
        t.add_row(ch.name, CHECK_MARKS.get(ch.status, ch.status), ch.detail)
    c.print(t)
    for ch in checks:
        if ch.hint and ch.status in ("fail", "warn"):
            c.print(f"[bold]hint[/] ({ch.name}): {ch.hint}", highlight=False)
