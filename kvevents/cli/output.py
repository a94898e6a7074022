"""What the commands print besides their own renderings: consoles, stdout/stderr lines, warnings,
library log records as one-line messages, and the doctor check table."""

from __future__ import annotations

import logging
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from kvevents.recordlog import Damage

HASH_WIDTH = 240  # a piped console of hash tables: 64-char hashes are never truncated
CHECK_MARKS = {"ok": "[green]✓ ok[/]", "fail": "[red]✗ FAIL[/]", "warn": "[yellow]! warn[/]", "skip": "[dim]- skip[/]"}


def out_console(width: int = 200) -> Console:
    """A stdout console that does not wrap long lines (hashes, paths) when piped."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=width)
    return console


def err_console() -> Console:
    return Console(stderr=True)


def out_line(line: str) -> None:
    """One line on stdout, flushed (a reader of a pipe sees it at once)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def err_line(line: str) -> None:
    """One line on stderr as given, flushed."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def say(prog: str, message: str) -> None:
    """One line on stderr, prefixed with the command (`kvevents bridge: ...`)."""
    err_line(f"kvevents {prog}: {' '.join(str(message).split())}")


def note(message: str) -> None:
    """One `kvevents: ...` line on stderr."""
    err_line(f"kvevents: {message}")


def warn(message: str) -> None:
    """One `kvevents: warning: ...` line on stderr."""
    err_line(f"kvevents: warning: {' '.join(message.split())}")


def warn_damage(d: Damage) -> None:
    """on_damage callback for the CLI: one warning line on stderr."""
    err_line(f"kvevents: warning: {d.message()}")


def log_to_stderr() -> None:
    """Library warnings (stale sources, losses, NATS disconnects) as one-line `kvevents: WARNING:` messages."""
    logger = logging.getLogger("kvevents")
    if not logger.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("kvevents: %(levelname)s: %(message)s"))
        logger.addHandler(h)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def show_plain_bind_once() -> None:
    """The publishers' plain-bind warning, once per command, as a `kvevents: warning:` line."""
    from kvevents.zeromq.security import OnceFilter

    logger = logging.getLogger("kvevents.zeromq.publisher")
    if any(isinstance(f, OnceFilter) for h in logger.handlers for f in h.filters):
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("kvevents: warning: %(message)s"))
    h.setLevel(logging.WARNING)
    h.addFilter(OnceFilter())
    logger.addHandler(h)
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
