"""kvevents CLI commands (transport)."""

from kvevents.cli.app import app  # noqa: F401
