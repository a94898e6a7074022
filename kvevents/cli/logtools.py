"""kvevents CLI commands (logtools)."""

from kvevents.cli.app import app  # noqa: F401
