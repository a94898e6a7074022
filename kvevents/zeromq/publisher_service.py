"""The publisher's service thread: an empty heartbeat batch once no seq was consumed for
`heartbeat_interval_s` (with `heartbeat_before_first` off, only once a batch was published), and
the replay ROUTER polled, its requests answered in slices (replay_server.ReplayServer), a
persistent socket error logged once per 100 and backed off.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import zmq

from kvevents.zeromq.replay_server import ReplayServer

__all__ = ["ServiceLoop"]

log = logging.getLogger("kvevents.zeromq.publisher")  # the publisher's logger: its warnings are its own


class ServiceLoop:
    """`run()` is the thread's body; it returns once `stop` is set (or a heartbeat finds the
    publisher closed). `next_seq` reads the publisher's next seq (no lock: a change is all that
    counts); `heartbeat` publishes one empty batch and raises ValueError once closed."""

    def __init__(
        self,
        *,
        next_seq: Callable[[], int],
        heartbeat: Callable[[], object],
        heartbeat_s: float,
        heartbeat_before_first: bool = True,
        server: ReplayServer | None,
        router: zmq.Socket | None,
        stop: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._next_seq = next_seq
        self._heartbeat = heartbeat
        self._hb = heartbeat_s
        self._hb_first = heartbeat_before_first  # False: the first heartbeat waits for a published batch
        self._server = server
        self._router = router
        self._stop = stop
        self._clock = clock

    def run(self) -> None:
        hb, svc, sock, stop = self._hb, self._server, self._router, self._stop
        seen_seq, quiet_since = -1, self._clock()
        errors = 0
        while not stop.is_set():
            wait = 0.05
            seq = self._next_seq()
            if hb > 0 and (self._hb_first or seq > 0):
                now = self._clock()
                if seq != seen_seq:  # idle = no seq consumed (cheaper than a clock read per publish)
                    seen_seq, quiet_since = seq, now
                elif now - quiet_since >= hb:
                    try:
                        self._heartbeat()
                    except ValueError:
                        return  # closed under us
                    seen_seq, quiet_since = self._next_seq(), now
                wait = min(wait, max(0.0, quiet_since + hb - now))
            if svc is not None and svc.jobs:
                wait = 0.001 if svc.blocked else 0.0
            if sock is None or svc is None:
                stop.wait(wait)
                continue
            try:
                if sock.poll(int(wait * 1000)):
                    svc.handle_requests()
                if svc.jobs:
                    svc.step()
                errors = 0
            except zmq.ZMQError as exc:
                if stop.is_set():
                    return
                errors += 1  # a persistent error must not spin: log once per 100, back off
                if errors % 100 == 1:
                    log.warning("publisher ROUTER error (%d in a row): %s", errors, exc)
                stop.wait(min(1.0, 0.01 * errors))
