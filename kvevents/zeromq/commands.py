"""What the sequencer asks of the subscriber's socket loop: send a request, or drop a DEALER."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

__all__ = ["Send", "DropDealer", "Command"]


@dataclass(slots=True)
class Send:
    """Send `body` as one request on the DEALER of `source` (made when there is none)."""

    source: str
    body: bytes


@dataclass(slots=True)
class DropDealer:
    """Close the DEALER of `source`: replies to a timed-out request must not arrive later."""

    source: str


Command = Union[Send, DropDealer]
