"""What the commands print besides their own renderings: consoles laid out to the terminal's width
(80 when piped) and tables that fall back to records when too wide for it, stdout/stderr lines,
warnings, library log records as one-line messages, and the doctor check table."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from kvevents.recordlog import Damage

CHECK_MARKS = {"ok": "[green]✓ ok[/]", "fail": "[red]✗ FAIL[/]", "warn": "[yellow]! warn[/]", "skip": "[dim]- skip[/]"}
PIPED_WIDTH = 80  # the width of piped output when COLUMNS does not say


def out_console() -> Console:
    """A stdout console laid out to the terminal's width (piped: COLUMNS, else 80), whose lines are
    never wrapped: a long line (a path, a hash) stays one line, for the terminal to fold or a
    pipe to read whole; a table that does not fit the width is for the command to lay out
    another way (`fits`, `print_records`)."""
    console = Console(soft_wrap=True)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(soft_wrap=True, width=PIPED_WIDTH)
    return console


def fits(console: Console, table: Table) -> bool:
    """Would `table`, every cell on one line, print within the console's width (no cell cut short)?"""
    unbounded = console.options.update_width(1 << 20)  # measured at any width: its natural width
    return Measurement.get(console, unbounded, table).maximum <= console.width


def record_lines(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """A table too wide for `width` as records: per row `HEADER0 VALUE0`, then the other columns
    as `header value` pairs, packed into lines of at most `width` characters (continuation lines
    indented; a pair longer than that gets a line of its own, never cut)."""
    lines = [title] if title else []
    for row in rows:
        line = f"{headers[0]} {row[0]}"
        for head, value in zip(headers[1:], row[1:]):
            pair = f"{head} {value}"
            if len(line) + 2 + len(pair) > width and line.strip():
                lines.append(line)
                line = ""
            line = f"{line}  {pair}"
        lines.append(line)
    return lines


def print_records(console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """`record_lines` printed as they are (no markup, no highlighting)."""
    for line in record_lines(title, headers, rows, console.width):
        console.print(line, markup=False, highlight=False)


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


class LineFormatter(logging.Formatter):
    """`kvevents: warning: ...`: library records in the form of the CLI's own warning lines."""

    def format(self, record: logging.LogRecord) -> str:
        return f"kvevents: {record.levelname.lower()}: {' '.join(record.getMessage().split())}"


def log_to_stderr() -> None:
    """Library warnings (stale sources, losses, NATS disconnects) as one-line `kvevents: warning:` messages."""
    logger = logging.getLogger("kvevents")
    if not logger.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(LineFormatter())
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
