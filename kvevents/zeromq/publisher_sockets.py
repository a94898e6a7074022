"""The publisher's sockets: its zmq.Context, the PUB socket and (with a replay endpoint) the ROUTER,
bound or connected with CURVE applied before bind; a failed bind or connect as one ValueError naming
the endpoint; the warning for plain endpoints reachable beyond loopback; and closing it all so the
ports are free again on return (schemas/README.md, "Transport in one page").
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import zmq

from kvevents.zeromq import security
from kvevents.zeromq.publisher_config import PublisherConfig
from kvevents.zeromq.replay_server import prepare_router_socket
from kvevents.zeromq.wire import offset_endpoint, should_bind

__all__ = ["PLAIN_BIND_WARNING", "BIND_ERRORS", "PublisherSockets", "raw_send"]

log = logging.getLogger("kvevents.zeromq.publisher")  # the publisher's logger: its warnings are its own

PLAIN_BIND_WARNING = "plain-bind"  # the log record key (security.OnceFilter) of warn_if_exposed's line
BIND_ERRORS = {  # what a failed bind / connect means, by errno
    errno.ENODEV: "the host cannot be resolved or is not an address of this machine (cannot bind)",
    errno.EADDRINUSE: "the address is already in use",
    errno.EADDRNOTAVAIL: "the address is not on this machine (cannot bind)",
}


def raw_send(sock: zmq.Socket) -> Any:
    """pyzmq's compiled send bound to `sock`, skipping the Python wrapper (half the cost for bytes)."""
    try:
        from zmq.backend import Socket as _Backend

        if isinstance(sock, _Backend):
            return _Backend.send.__get__(sock)
    except (ImportError, AttributeError):  # pragma: no cover - another pyzmq backend
        pass
    return sock.send  # pragma: no cover


class PublisherSockets:
    """Opens the PUB socket and the optional ROUTER on construction; `close()` releases both.

    A failure closes what was opened and raises one ValueError naming the endpoint. Each set owns
    its zmq.Context (unless given one, or an endpoint is inproc://), so `close()` frees the ports.
    """

    def __init__(
        self, config: PublisherConfig, context: zmq.Context | None, curve: security.CurveServer | None
    ) -> None:
        inproc = any(e and e.startswith("inproc://") for e in (config.endpoint, config.replay_endpoint))
        # inproc peers must share the context: use the global one (no ports to release there)
        self._own_ctx = context is None and not inproc
        self._ctx = context or (zmq.Context.instance() if inproc else zmq.Context())
        self._curve = curve
        self._curve_handles: list[security.ServerHandle] = []
        self._pub: zmq.Socket | None = None
        self.router: zmq.Socket | None = None
        self.replay_endpoint: str | None = None
        failed = config.endpoint
        try:
            self.endpoint: str = self._open_pub(config)
            if config.replay_endpoint:
                failed = config.replay_endpoint
                self._open_router(config)
        except (zmq.ZMQError, ValueError) as exc:
            self.close()
            why = BIND_ERRORS.get(getattr(exc, "errno", None) or 0, str(exc))
            raise ValueError(f"publisher endpoint {failed!r}: {why}") from None

    def _open_pub(self, config: PublisherConfig) -> str:
        """The PUB socket, bound or connected; returns the endpoint it is on (the port read back)."""
        pub = self._pub = self._ctx.socket(zmq.PUB)
        if self._curve is not None:  # before bind: ZeroMQ's listener copies the options
            self._curve_handles.append(security.apply_server(pub, self._curve))
        self.send: Any = raw_send(pub)  # the compiled send: the publish path's three calls
        pub.setsockopt(zmq.SNDHWM, config.hwm)
        pub.setsockopt(zmq.LINGER, 0)
        endpoint = offset_endpoint(config.endpoint, config.dp_rank)
        if should_bind(endpoint, config.bind):
            pub.bind(endpoint)
            return pub.getsockopt_string(zmq.LAST_ENDPOINT)
        pub.connect(endpoint)
        return endpoint

    def _open_router(self, config: PublisherConfig) -> None:
        assert config.replay_endpoint
        r = self.router = self._ctx.socket(zmq.ROUTER)
        r.setsockopt(zmq.ROUTER_MANDATORY, 1)
        prepare_router_socket(r)  # request limits; before bind: ZeroMQ's listener copies the options
        if self._curve is not None:
            self._curve_handles.append(security.apply_server(r, self._curve))
        r.setsockopt(zmq.LINGER, 0)
        r.bind(offset_endpoint(config.replay_endpoint, config.dp_rank))
        self.replay_endpoint = r.getsockopt_string(zmq.LAST_ENDPOINT)

    def warn_if_exposed(self) -> None:
        """One line for endpoints reachable beyond loopback without CURVE (a CLI running several
        publishers shows it once: security.OnceFilter)."""
        exposed = security.exposed_endpoints(self.endpoint, self.replay_endpoint)
        if exposed:
            log.warning(
                "publisher on %s without CURVE: events (token ids, cache_salt) travel in clear to anyone "
                "who can reach it; use loopback or --curve-secret (README: Security)",
                " and ".join(exposed),
                extra={"kvevents_once": PLAIN_BIND_WARNING},
            )

    def curve_denied(self) -> int:
        """Connections the ZAP handler refused on these sockets (0 without CURVE)."""
        return sum(h.denied for h in self._curve_handles)

    def close(self, linger_ms: int = 0) -> None:
        """Close both sockets (the PUB one gives queued live messages `linger_ms` to leave), then
        terminate an owned context: returns once ZeroMQ has let go of the ports."""
        if self._pub is not None and not self._pub.closed:
            self._pub.setsockopt(zmq.LINGER, linger_ms)
        for s in (self._pub, self.router):
            if s is not None and not s.closed:
                s.close()
        for h in self._curve_handles:  # the last one stops the context's ZAP authenticator
            security.release_server(h)
        self._curve_handles = []
        if self._own_ctx and not self._ctx.closed:
            self._ctx.term()
