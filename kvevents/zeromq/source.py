"""One ZeroMQ publisher to follow: its endpoints, name, CURVE keys and start mode, and the CLI's
`NAME=ENDPOINT[,REPLAY_ENDPOINT]` form."""

from __future__ import annotations

from dataclasses import dataclass

from kvevents.feed import START_MODES
from kvevents.zeromq.security import CurveClient
from kvevents.zeromq.wire import check_endpoint

__all__ = ["Source", "parse_source"]


@dataclass(slots=True)
class Source:
    """One publisher: live endpoint, optional replay ROUTER endpoint, a name (default: the endpoint).

    `bind=True` binds the SUB socket instead of connecting (for publishers that connect).
    `curve`: this publisher's CURVE server key and our client keys (transport.security), for
    both its live and replay endpoints. `start`: one of START_MODES (None: the Subscriber's).
    """

    endpoint: str
    replay_endpoint: str | None = None
    name: str | None = None
    bind: bool = False
    curve: CurveClient | None = None
    start: str | None = None

    def __post_init__(self) -> None:
        if not self.endpoint:
            raise ValueError("Source: endpoint must not be empty")
        if self.start is not None and self.start not in START_MODES:
            raise ValueError(
                f"source {self.name or self.endpoint!r}: start must be one of {', '.join(START_MODES)}, got {self.start!r}"
            )
        if self.name is None:
            self.name = self.endpoint
        for what, ep in (("", self.endpoint), ("replay ", self.replay_endpoint)):
            if ep:  # a tcp port > 65535 would silently wrap in libzmq: refuse it here
                try:
                    check_endpoint(ep)
                except ValueError as exc:  # "source 'w': cannot use replay endpoint 'tcp://...': why"
                    raise ValueError(f"source {self.name!r}: cannot use {what}{exc}") from None


def parse_source(spec: str, *, require_name: bool = True) -> Source:
    """`NAME=ENDPOINT[,REPLAY_ENDPOINT]` (the CLI's --publisher) -> Source; ValueError naming the spec.

    With `require_name=False` a bare `ENDPOINT[,REPLAY]` is accepted and named after its endpoint.
    """
    usage = f"--publisher {spec!r}: expected NAME=ENDPOINT[,REPLAY_ENDPOINT], e.g. w0=tcp://127.0.0.1:5557,tcp://127.0.0.1:5558"
    name, sep, rest = spec.partition("=")
    if not sep or "://" in name:
        if require_name:
            raise ValueError(usage)
        name, rest = "", spec
    elif not name.strip():
        raise ValueError(usage)
    parts = [p.strip() for p in rest.split(",")]
    if len(parts) > 2 or not all(parts):
        raise ValueError(usage)
    for p in parts:
        if "://" not in p:
            raise ValueError(f"{usage} ({p!r} is not a ZeroMQ endpoint such as tcp://host:port or ipc://path)")
    return Source(parts[0], parts[1] if len(parts) > 1 else None, name.strip() or None)
