"""Who may call the router's HTTP front, and over what: bearer keys and TLS (`kvevents route
--api-key`, `--read-only-key`, `--tls-cert/--tls-key`).

`HttpSecurity` holds the settings. `AuthMiddleware` (plain ASGI, in front of every route) checks the
key of each request in constant time: `/healthz` is open; the read-only key reaches GET /workers,
/status.json, / and /metrics; everything else (POST /score, the proxy's /v1 endpoints,
/openapi.json) needs the full key. A missing or wrong key is a 401 with a JSON error and
`WWW-Authenticate: Bearer`; the read-only key elsewhere is a 403. The key may also come as the
password of HTTP Basic (any user name), so a browser can open the status page. What a caller
holding only the read-only key does not see (copies by adapter: tenant information) is cut by
`tenant_redacted`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = [
    "ACCESS_KEY",
    "FULL",
    "OPEN_PATHS",
    "READ",
    "READ_PATHS",
    "AuthMiddleware",
    "HttpSecurity",
    "access_of",
    "is_loopback_host",
    "tenant_redacted",
]

FULL, READ = "full", "read"
ACCESS_KEY = "kvevents.access"  # the ASGI scope entry the middleware leaves for the handlers
OPEN_PATHS = frozenset({"/healthz"})
READ_PATHS = frozenset({"/workers", "/status.json", "/", "/metrics"})
REALM = 'realm="kvevents route"'

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _check_key(what: str, key: str) -> bytes:
    if not key or any(not (0x21 <= ord(c) <= 0x7E) for c in key):
        raise ValueError(f"{what}: a key is one or more visible ASCII characters (no spaces)")
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class HttpSecurity:
    """Bearer keys (None: no check) and the TLS certificate and key files (None: plain HTTP)."""

    api_key: str | None = None
    read_only_key: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if self.read_only_key is not None and self.api_key is None:
            raise ValueError("--read-only-key needs --api-key: without it every endpoint is open anyway")
        if self.api_key is not None:
            _check_key("--api-key", self.api_key)
        if self.read_only_key is not None:
            _check_key("--read-only-key", self.read_only_key)
            if hmac.compare_digest(self.read_only_key.encode(), (self.api_key or "").encode()):
                raise ValueError("--read-only-key must differ from --api-key")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give --tls-cert and --tls-key together")

    @property
    def keyed(self) -> bool:
        return self.api_key is not None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def check_tls(self) -> None:
        """Load the certificate and key once (ValueError naming what is wrong), before uvicorn does."""
        if self.tls_cert is None or self.tls_key is None:
            return
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except FileNotFoundError as exc:
            raise ValueError(f"--tls-cert/--tls-key: no such file: {exc.filename}") from None
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"--tls-cert/--tls-key: cannot load {self.tls_cert} with {self.tls_key}: {exc}") from None


def _presented(header: bytes) -> bytes | None:
    """The key in an Authorization header: `Bearer KEY`, or `Basic base64(user:KEY)` (a browser)."""
    scheme, _, rest = header.strip().partition(b" ")
    scheme = scheme.lower()
    if scheme == b"bearer":
        return rest.strip()
    if scheme == b"basic":
        try:
            decoded = base64.b64decode(rest.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        return decoded.partition(b":")[2]
    return None


def access_of(security: HttpSecurity, header: bytes | None) -> str | None:
    """FULL, READ or None (no key, or a wrong one) for an Authorization header. Both keys are
    compared, as SHA-256 digests with hmac.compare_digest: the time taken says nothing about either."""
    got = _presented(header) if header else None
    digest = hashlib.sha256(got or b"").digest()
    full = hmac.compare_digest(digest, hashlib.sha256((security.api_key or "").encode()).digest())
    read = hmac.compare_digest(digest, hashlib.sha256((security.read_only_key or "").encode()).digest())
    if not got:
        return None
    if full and security.api_key is not None:
        return FULL
    if read and security.read_only_key is not None:
        return READ
    return None


def _error(path: str, message: str, code: str) -> bytes:
    if path.startswith("/v1/"):  # OpenAI clients read error.message
        obj: Any = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    else:
        obj = {"error": message}
    return msgspec.json.encode(obj) + b"\n"


class AuthMiddleware:
    """Checks every HTTP request's key before the app sees it (see the module docstring)."""

    def __init__(self, app: ASGIApp, security: HttpSecurity) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.security.keyed:
            scope[ACCESS_KEY] = FULL
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path in OPEN_PATHS:
            scope[ACCESS_KEY] = None
            return await self.app(scope, receive, send)
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        access = access_of(self.security, header)
        if access is None:
            why = "a wrong API key" if header else "no API key"
            challenge = f'Bearer {REALM}, error="invalid_token"' if header else f"Bearer {REALM}"
            extra = [(b"www-authenticate", f"Basic {REALM}".encode())] if path == "/" else []
            message = f"{why}: send Authorization: Bearer KEY (kvevents route --api-key)"
            return await _answer(send, 401, _error(path, message, "invalid_api_key"), challenge, extra)
        if access == READ and path not in READ_PATHS:
            message = f"the read-only key reaches only {', '.join(sorted(READ_PATHS))}; {path} needs the API key"
            return await _answer(send, 403, _error(path, message, "insufficient_permissions"), None, [])
        scope[ACCESS_KEY] = access
        return await self.app(scope, receive, send)


async def _answer(send: Send, status: int, body: bytes, challenge: str | None, extra: list) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if challenge is not None:
        headers.append((b"www-authenticate", challenge.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers + extra})
    await send({"type": "http.response.body", "body": body})


def tenant_redacted(view: dict[str, Any]) -> dict[str, Any]:
    """/status.json as a read-only caller sees it: no copies by adapter (which tenants use which
    adapter, and how much), `tenant_detail` false."""
    workers = [{k: v for k, v in w.items() if k != "blocks_by_adapter"} for w in view.get("workers", [])]
    return {**view, "workers": workers, "adapters": [], "tenant_detail": False}


def is_loopback_host(host: str) -> bool:
    """True for localhost and loopback addresses; a wildcard, another address or a name is not."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
