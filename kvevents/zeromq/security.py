"""Opt-in ZeroMQ CURVE on the wire: key files in pyzmq's certificate format, socket options, ZAP.

A publisher is a CURVE *server* (its secret key file); consumers are *clients* (the server's public
key, and their own keypair). With an allow-list directory (pyzmq's convention: one `NAME.key`
public certificate per allowed client) only those clients complete the handshake; without one any
client holding the server's public key does (encryption and server authentication only).
CURVE is transparent to the wire format: the same frames travel, encrypted.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.utils.z85

# zmq.auth (and its asyncio) is imported where keys are read or a server starts: embedding a
# publisher without CURVE does not pay for it

__all__ = [
    "CurveServer",
    "CurveClient",
    "generate_keypair",
    "load_public_key",
    "load_keypair",
    "apply_server",
    "apply_client",
    "client_context",
    "release_server",
    "exposed_endpoints",
    "OnceFilter",
]

log = logging.getLogger("kvevents.security")
_KEY_LEN = 40  # a Z85-encoded 32-byte curve key


def _check_key(key: bytes | None, path: str, what: str) -> bytes:
    if key is None or len(key) != _KEY_LEN:
        raise ValueError(f"{path}: no {what} key in pyzmq's certificate format (a `kvevents keys generate` file)")
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, KeyError):
        raise ValueError(f"{path}: the {what} key is not Z85 text") from None
    return key


def _read(path: str | os.PathLike[str]) -> tuple[bytes | None, bytes | None]:
    import zmq.auth

    p = str(path)
    if not os.path.isfile(p):
        raise ValueError(f"{p}: no such key file")
    try:
        return zmq.auth.load_certificate(p)
    except ValueError:  # pyzmq: no public-key line
        return None, None
    except OSError as exc:
        raise ValueError(f"{p}: cannot read key file: {exc.strerror or exc}") from None


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """The public key of a certificate file (a `.key` file, or a `.key_secret` that holds both)."""
    public, _ = _read(path)
    return _check_key(public, str(path), "public")


def load_keypair(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(public, secret) from a secret certificate file (`NAME.key_secret`)."""
    public, secret = _read(path)
    return _check_key(public, str(path), "public"), _check_key(secret, str(path), "secret")


def generate_keypair(directory: str | os.PathLike[str], name: str = "kvevents") -> tuple[Path, Path]:
    """Write NAME.key (public) and NAME.key_secret (both keys, mode 0600) in `directory`, pyzmq's
    format (zmq.auth.create_certificates). Existing files are never overwritten (ValueError)."""
    if not name or os.sep in name or name.startswith("."):
        raise ValueError(f"key name {name!r}: use a plain file name such as 'engine0'")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    public, secret = d / f"{name}.key", d / f"{name}.key_secret"
    for p in (public, secret):
        if p.exists():
            raise ValueError(f"{p} exists: keys are never overwritten (pick another --name or directory)")
    import zmq.auth

    old = os.umask(0o077)  # the secret file is created private, not chmod-ed afterwards
    try:
        pub_s, sec_s = zmq.auth.create_certificates(str(d), name)
    finally:
        os.umask(old)
    os.chmod(pub_s, 0o644)
    return Path(pub_s), Path(sec_s)


@dataclass(frozen=True)
class CurveServer:
    """A publisher's CURVE side: its keypair and the allowed client keys (None: any client)."""

    public_key: bytes
    secret_key: bytes
    allowed: frozenset[bytes] | None = None
    allow_dir: str | None = None

    @classmethod
    def from_files(
        cls, secret_file: str | os.PathLike[str], allow_dir: str | os.PathLike[str] | None = None
    ) -> CurveServer:
        """Load the server's `.key_secret` and, if given, every `*.key` in `allow_dir` (read once, here)."""
        import zmq.auth

        public, secret = load_keypair(secret_file)
        allowed = None
        if allow_dir is not None:
            if not os.path.isdir(allow_dir):
                raise ValueError(f"{allow_dir}: not a directory of allowed client certificates (*.key)")
            try:
                allowed = frozenset(zmq.auth.load_certificates(str(allow_dir)))
            except (OSError, ValueError) as exc:
                raise ValueError(f"{allow_dir}: cannot read client certificates: {exc}") from None
            if not allowed:
                raise ValueError(f"{allow_dir}: no client certificate (*.key) in it: no client could connect")
        return cls(public, secret, allowed, None if allow_dir is None else str(allow_dir))


@dataclass(frozen=True)
class CurveClient:
    """A consumer's CURVE side: the server's public key and its own keypair (a fresh one when not
    given: enough for a publisher without an allow-list)."""

    server_key: bytes
    public_key: bytes = b""
    secret_key: bytes = b""

    def __post_init__(self) -> None:
        if not self.public_key or not self.secret_key:
            public, secret = zmq.curve_keypair()
            object.__setattr__(self, "public_key", public)
            object.__setattr__(self, "secret_key", secret)

    @classmethod
    def from_files(
        cls, server_key_file: str | os.PathLike[str], client_cert: str | os.PathLike[str] | None = None
    ) -> CurveClient:
        """The server's public certificate, and this client's `.key_secret` (None: a throwaway keypair)."""
        server = load_public_key(server_key_file)
        if client_cert is None:
            return cls(server)
        public, secret = load_keypair(client_cert)
        return cls(server, public, secret)


def apply_client(sock: zmq.Socket, client: CurveClient | None) -> None:
    """Make `sock` a CURVE client of `client.server_key` (before connect); None leaves it plain."""
    if client is None:
        return
    sock.setsockopt(zmq.CURVE_SERVERKEY, client.server_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, client.public_key)
    sock.setsockopt(zmq.CURVE_SECRETKEY, client.secret_key)


def client_context(client: CurveClient | None, base: zmq.Context | None = None) -> zmq.Context:
    """A context whose new sockets are CURVE clients of `client` (pyzmq's per-context default socket
    options), sharing `base`'s (default: the global context's) I/O threads: for tools that take a
    `context=` (kvevents.doctor.zeromq, engine_requests). None returns `base` itself. Never terminate it."""
    ctx = base or zmq.Context.instance()
    if client is None:
        return ctx
    shadow: zmq.Context = zmq.Context.shadow(ctx.underlying)
    shadow.setsockopt(zmq.CURVE_SERVERKEY, client.server_key)
    shadow.setsockopt(zmq.CURVE_PUBLICKEY, client.public_key)
    shadow.setsockopt(zmq.CURVE_SECRETKEY, client.secret_key)
    return shadow


# ---------------------------------------------------------------- the ZAP authenticator, one per context
@dataclass
class _Allow:
    """pyzmq's credentials-provider callback for one server socket's ZAP domain; counts refusals."""

    keys: frozenset[bytes] | None
    denied: int = 0

    def callback(self, domain: str, key: bytes) -> bool:
        if self.keys is None or key in self.keys:
            return True
        self.denied += 1
        return False


@dataclass
class _Auth:
    auth: Any  # zmq.auth.thread.ThreadAuthenticator
    domains: dict[str, _Allow] = field(default_factory=dict)


_AUTHS: dict[int, _Auth] = {}
_AUTHS_LOCK = threading.Lock()


class ServerHandle:
    """What apply_server returns: the socket's ZAP domain and its refusal count (release it on close)."""

    def __init__(self, ctx: zmq.Context, domain: str, allow: _Allow) -> None:
        self.key, self.domain, self._allow = ctx.underlying, domain, allow

    @property
    def denied(self) -> int:
        """Handshakes refused because the client's key is not on the allow-list."""
        return self._allow.denied


def apply_server(sock: zmq.Socket, server: CurveServer) -> ServerHandle:
    """Make `sock` a CURVE server (before bind) under its own ZAP domain, checked by the context's
    one ThreadAuthenticator (started on first use, stopped by the last release_server)."""
    from zmq.auth.thread import ThreadAuthenticator

    ctx = sock.context
    domain = f"kvevents-{secrets.token_hex(6)}"
    allow = _Allow(server.allowed)
    with _AUTHS_LOCK:
        entry = _AUTHS.get(ctx.underlying)  # shadows of one context share its ZAP endpoint
        if entry is None:
            auth = ThreadAuthenticator(ctx, log=logging.getLogger("kvevents.security.zap"))
            auth.start()
            entry = _AUTHS[ctx.underlying] = _Auth(auth)
        entry.domains[domain] = allow
        entry.auth.configure_curve_callback(domain, credentials_provider=allow)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, server.public_key)
    sock.setsockopt(zmq.CURVE_SECRETKEY, server.secret_key)
    sock.setsockopt_string(zmq.ZAP_DOMAIN, domain)
    if hasattr(zmq, "ZAP_ENFORCE_DOMAIN"):  # fail closed if the ZAP handler is gone
        try:
            sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        except zmq.ZMQError:  # pragma: no cover - a libzmq built without draft options
            pass
    return ServerHandle(ctx, domain, allow)


def release_server(handle: ServerHandle | None) -> None:
    """Forget a server socket's domain (after the socket is closed); the last one stops the
    authenticator so that its context can terminate."""
    if handle is None:
        return
    with _AUTHS_LOCK:
        entry = _AUTHS.get(handle.key)
        if entry is None or entry.domains.pop(handle.domain, None) is None:
            return
        entry.auth.credentials_providers.pop(handle.domain, None)
        if entry.domains:
            return
        del _AUTHS[handle.key]
    entry.auth.stop()


# ---------------------------------------------------------------- plain binds that leave the machine
def _loopback_host(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # '*', an interface name or a hostname: reachable from elsewhere


def exposed_endpoints(*endpoints: str | None) -> list[str]:
    """The tcp endpoints (of those given) that are not on loopback: reachable from other machines."""
    out = []
    for ep in endpoints:
        if not ep or not ep.startswith("tcp://"):
            continue
        host = ep[len("tcp://") :].rpartition(":")[0]
        host = host.rpartition(";")[2]  # 'tcp://src;dst:port': the destination
        if not _loopback_host(host):
            out.append(ep)
    return out


class OnceFilter(logging.Filter):
    """A logging filter passing a record carrying `extra={"kvevents_once": KEY}` only the first time
    (a CLI with several publishers shows the plain-bind warning once)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[Any] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = getattr(record, "kvevents_once", None)
        if key is None:
            return True
        if key in self._seen:
            return False
        self._seen.add(key)
        return True
