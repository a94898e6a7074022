"""kvevents CLI commands (consumers)."""

from kvevents.cli.app import app  # noqa: F401
