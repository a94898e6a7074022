"""`kvevents doctor`'s "sockets and keys" check: is a PUB at the live endpoint and a ROUTER at the
replay endpoint, and do the CURVE keys let a handshake through?

A monitored SUB connects to the live endpoint and a monitored DEALER to the replay endpoint; their
handshake events (kvevents.zeromq.handshake) tell a replay ROUTER at the live port (live and replay
swapped), a live PUB at the replay port, and CURVE given on one side only or with the wrong key,
each of which otherwise only shows as "no message arrived" or "replay does not answer". A failure
found here becomes the hint of those later checks: the likely cause, named.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvevents.zeromq.handshake import LIVE, MONITOR_EVENTS, REPLAY, HandshakeWatch

__all__ = ["Wiring", "probe_wiring"]

NAME = "sockets and keys"


@dataclass
class Wiring:
    """What the handshakes said: per side a problem line, or whether a handshake succeeded."""

    live_ok: bool = False
    replay_ok: bool = False
    live_problem: str | None = None
    replay_problem: str | None = None

    def add_check(self, rep: Any, endpoint: str, replay: str | None) -> None:
        """The check line on a DoctorReport."""
        problems = [p for p in (self.live_problem, self.replay_problem) if p]
        if self.swapped:
            rep.add(NAME, "fail", f"{endpoint} is a ROUTER and {replay} a PUB", self.cause or "")
        elif problems:
            where = " and ".join(
                side for side, p in (("live", self.live_problem), ("replay", self.replay_problem)) if p is not None
            )
            rep.add(NAME, "fail", f"no ZeroMQ handshake at the {where} endpoint", " ".join(problems))
        elif self.live_ok:
            said = "live: a PUB completed the handshake" + ("; replay: a ROUTER did" if self.replay_ok else "")
            rep.add(NAME, "ok", said)
        else:
            rep.add(NAME, "skip", "no handshake completed in time (a slow link?)")

    @property
    def swapped(self) -> bool:
        both = self.live_problem and self.replay_problem
        return bool(both and "not a PUB" in str(self.live_problem) and "not a ROUTER" in str(self.replay_problem))

    @property
    def cause(self) -> str | None:
        """One line naming the likely misconfiguration (None: none seen)."""
        if self.swapped:
            return "the live and replay endpoints are swapped: give the PUB's port as ENDPOINT and the ROUTER's as --replay"
        return self.live_problem or self.replay_problem

    def explain(self, rep: Any) -> None:
        """Name the cause as the hint of the checks it makes fail (nothing arrives, replay silent)."""
        for ch in rep.checks:
            if ch.status not in ("fail", "warn"):
                continue
            if ch.name in ("batches arrive and decode", "published hashes recompute") and self.live_problem:
                ch.hint = f"likely cause: {self.cause}"
            elif ch.name in ("replay answers", "describe answers") and self.replay_problem:
                ch.hint = f"likely cause: {self.cause}"


def _monitored(ctx: zmq.Context, kind: int, endpoint: str) -> tuple[zmq.Socket, zmq.Socket]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"\xff-kvevents-doctor-probe")  # nothing: only the handshake matters
    mon = sock.get_monitor_socket(MONITOR_EVENTS)
    sock.connect(endpoint)
    return sock, mon


def probe_wiring(endpoint: str, replay: str | None, ctx: zmq.Context, wait_s: float = 1.5) -> Wiring:
    """Connect a SUB to `endpoint` and a DEALER to `replay` (CURVE clients when `ctx` makes them so)
    and watch their handshakes for up to `wait_s`."""
    curve = zmq.CURVE_SERVERKEY in getattr(ctx, "sockopts", {})
    watch = HandshakeWatch()
    sides = [(LIVE, zmq.SUB, endpoint)] + ([(REPLAY, zmq.DEALER, replay)] if replay else [])
    opened = []
    done: dict[str, bool] = {}
    try:
        for role, kind, ep in sides:
            watch.watch("doctor", role, str(ep), curve)
            opened.append((role, *_monitored(ctx, kind, str(ep))))
        deadline = time.monotonic() + wait_s
        while len(done) < len(opened) and time.monotonic() < deadline:
            for role, _sock, mon in opened:
                while time.monotonic() < deadline and mon.poll(20):
                    msg = recv_monitor_message(mon)
                    event = int(msg["event"])
                    watch.event("doctor", role, event, int(msg["value"]))
                    if role not in done and watch.settled("doctor", role):  # a handshake, or a cause for certain
                        done[role] = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        for _role, sock, mon in opened:
            sock.disable_monitor()
            mon.close(0)
            sock.close(0)
    return Wiring(
        done.get(LIVE, False),
        done.get(REPLAY, False),
        watch.side_problem("doctor", LIVE),
        watch.side_problem("doctor", REPLAY),
    )
