"""Room on the process's shared ZeroMQ context for a fleet's sockets.

`zmq.Context.instance()` (shared by subscribers, in-process publishers, the doctor and one-shot
engine requests, so `inproc://` endpoints meet) takes 1,023 sockets by default, and a subscriber
opens up to six per source (SUB and replay DEALER, each with a monitor pair): a router following a
few hundred publishers directly ran out. The limit can only be raised before the context's first
socket, so the package raises it when it is imported; a context some other code started first
keeps its limit (sockets then fail as before, with "Too many open files").
"""

from __future__ import annotations

import zmq

__all__ = ["FLEET_SOCKETS", "make_room"]

#: Sockets the shared context may hold (capped by libzmq's own SOCKET_LIMIT); the process's
#: file-descriptor limit (`ulimit -n`) still applies: a few descriptors per source.
FLEET_SOCKETS = 32768


def make_room(ctx: zmq.Context | None = None) -> int:
    """Raise `ctx`'s (default: the shared instance's) socket limit to FLEET_SOCKETS; the limit set.
    Has no effect on a context that has made sockets already."""
    ctx = ctx if ctx is not None else zmq.Context.instance()
    want = min(FLEET_SOCKETS, int(ctx.get(zmq.SOCKET_LIMIT)))
    try:
        if int(ctx.get(zmq.MAX_SOCKETS)) < want:
            ctx.set(zmq.MAX_SOCKETS, want)
    except zmq.ZMQError:  # a libzmq that refuses the option: its default stands
        pass
    return int(ctx.get(zmq.MAX_SOCKETS))
