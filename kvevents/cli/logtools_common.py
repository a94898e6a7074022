"""Helpers shared by the logtools commands: consoles and one-line damage warnings on stderr."""

from __future__ import annotations

import sys

from rich.console import Console

from kvevents.recordlog import Damage


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
