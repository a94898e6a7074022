"""Deprecated path, kept for one release: the subscriber lives in `kvevents.zeromq.subscriber`."""

from kvevents.zeromq.subscriber import (
    START_MODES,
    Delivery,
    Output,
    Reset,
    Source,
    SourceStatus,
    Subscriber,
    parse_source,
)

__all__ = ["Source", "parse_source", "Delivery", "Reset", "SourceStatus", "Subscriber", "START_MODES", "Output"]
