"""What a consumer's sockets see of a publisher's endpoints that names a misconfiguration (sans-IO).

A socket monitor (`MONITOR_EVENTS`) reports each connection and its ZeroMQ handshake. Three
mistakes look like "nothing arrives" and are told apart here:
- the wrong socket at an endpoint: ZeroMQ refuses a SUB talking to a ROUTER and a DEALER talking
  to a PUB by closing the connection before any handshake event, so a connection dropped in its
  handshake at the live endpoint means a replay ROUTER there (live and replay swapped), at the
  replay endpoint a live PUB (the replay given a live port);
- CURVE on one side only: the handshake fails with a mechanism mismatch;
- the wrong CURVE key: the handshake fails without detail (the server cannot open the client's
  hello), or the publisher's allow-list refuses the client (an authentication failure).
`HandshakeWatch.problem(source)` is that cause as one line, or None once a handshake succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

__all__ = ["HandshakeWatch", "LIVE", "REPLAY", "MONITOR_EVENTS"]

LIVE, REPLAY = "live", "replay"
MONITOR_EVENTS = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_OPENED = zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED


@dataclass(slots=True)
class _Side:
    """One socket of a source (its SUB, or its replay DEALER): a connection mid-handshake, the cause."""

    endpoint: str
    curve: bool
    opened: bool = False
    problem: str | None = None
    certain: bool = False  # the problem came from a definite answer (mechanism mismatch, refused key)
    seen: bool = False  # a handshake succeeded once


def wrong_socket(role: str, endpoint: str) -> str:
    """The cause of a connection dropped in its handshake at the live or the replay endpoint."""
    if role == LIVE:
        return (
            f"{endpoint} accepts connections but is not a PUB socket (ZeroMQ dropped the SUB in its "
            "handshake): is it the replay ROUTER, live and replay swapped?"
        )
    return (
        f"replay endpoint {endpoint} is not a ROUTER socket (ZeroMQ dropped the replay DEALER in its "
        "handshake): is it a live PUB port? (kvevents serve puts the replay ports after every live port)"
    )


def curve_problem(role: str, endpoint: str, curve: bool, event: int, value: int) -> str:
    """The cause of a failed handshake, from the monitor's event and value. Without CURVE a failure
    without detail is the peer closing mid-handshake: it requires CURVE, or it is another socket
    type that saw the mismatch first (the next connection tells which)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (
            f"{endpoint} refuses this client's CURVE key: its --curve-allow directory lacks the public key of "
            "--curve-client-cert"
        )
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        if curve:
            return (
                f"{endpoint} does not use CURVE but this consumer does (--curve-server-key): no handshake; "
                "leave the key out, or start the publisher with --curve-secret"
            )
        return f"{endpoint} requires CURVE: no handshake without its public key (--curve-server-key NAME.key)"
    if curve:
        return (
            f"the CURVE handshake with {endpoint} fails: --curve-server-key is not this publisher's public key "
            "(NAME.key of its --curve-secret NAME.key_secret)"
        )
    other = (
        "not a PUB (the replay ROUTER? live and replay swapped)" if role == LIVE else "not a ROUTER (a live PUB port?)"
    )
    return (
        f"the ZeroMQ handshake with {endpoint} fails: is it {other}, or does it require CURVE "
        "(--curve-server-key NAME.key)?"
    )


class HandshakeWatch:
    """Per (source, socket role): monitor events in, the likely misconfiguration out. Events come from
    the feed's thread; `problem` may be read from any (it only reads strings)."""

    def __init__(self) -> None:
        self._sides: dict[tuple[str, str], _Side] = {}

    def watch(self, source: str, role: str, endpoint: str, curve: bool) -> None:
        """Start watching a socket (again: a new DEALER); its earlier verdict is kept until a new one."""
        old = self._sides.get((source, role))
        self._sides[(source, role)] = _Side(endpoint, curve, problem=old.problem if old else None)

    def event(self, source: str, role: str, event: int, value: int = 0) -> None:
        """One monitor event of the socket watched as (source, role)."""
        side = self._sides.get((source, role))
        if side is None:
            return
        if event & _OPENED:
            side.opened = True
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            side.opened, side.problem, side.certain, side.seen = False, None, False, True
        elif event == zmq.EVENT_DISCONNECTED:
            if side.opened:  # dropped before any handshake event: the wrong socket type at the endpoint
                side.problem, side.certain = wrong_socket(role, side.endpoint), True
            side.opened = False
        elif event & MONITOR_EVENTS:  # a handshake failure; a vague one never replaces a definite one
            side.opened = False
            certain = event == zmq.EVENT_HANDSHAKE_FAILED_AUTH or value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
            if certain or not side.certain:
                side.problem, side.certain = curve_problem(role, side.endpoint, side.curve, event, value), certain

    def side_problem(self, source: str, role: str) -> str | None:
        """The likely cause seen by one socket of a source (LIVE or REPLAY), or None."""
        side = self._sides.get((source, role))
        return None if side is None else side.problem

    def settled(self, source: str, role: str) -> bool:
        """A handshake of that socket succeeded, or it failed for a cause told for certain."""
        side = self._sides.get((source, role))
        return side is not None and (side.certain or (side.problem is None and not side.opened and side.seen))

    def problem(self, source: str) -> str | None:
        """The likely cause for a source (its live socket's first), or None."""
        for role in (LIVE, REPLAY):
            side = self._sides.get((source, role))
            if side is not None and side.problem is not None:
                return side.problem
        return None
