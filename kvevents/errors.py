"""The few named error types of kvevents; library code raises them, the CLI turns them into exit codes."""

from __future__ import annotations

__all__ = ["KVEventsError", "DecodeError"]


class KVEventsError(Exception):
    """Base of every kvevents-specific error."""


class DecodeError(KVEventsError, ValueError):
    """A payload that is not a valid KV event batch; the message says what was wrong and where."""
