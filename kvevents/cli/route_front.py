"""`kvevents route`'s HTTP front options: keys and TLS (AuthFlags; kvevents.consumers.service.auth),
the OpenAI-compatible proxy (ProxyFlags; kvevents.consumers.service.proxy), and the lines the
command prints. The bundles (kvevents.cli.flag_groups) are filed under route's --help panels there.

Each function turns a bad option into one line on stderr and exit 2 (kvevents.cli.app.user_error).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from kvevents.cli.app import user_error
from kvevents.cli.flag_groups import flag

if TYPE_CHECKING:  # pragma: no cover
    from kvevents.consumers.service.auth import HttpSecurity
    from kvevents.consumers.service.core import RouterService
    from kvevents.consumers.service.proxy import Proxy
    from kvevents.consumers.service.proxy_targets import WorkerUrl

__all__ = [
    "API_KEY_ENV",
    "READ_ONLY_KEY_ENV",
    "AuthFlags",
    "ProxyFlags",
    "front_security",
    "make_proxy",
    "served",
    "worker_urls",
]

API_KEY_ENV, READ_ONLY_KEY_ENV = "KVEVENTS_API_KEY", "KVEVENTS_READ_ONLY_KEY"


def front_security(
    api_key: Optional[str], read_only_key: Optional[str], tls_cert: Optional[str], tls_key: Optional[str], host: str
) -> HttpSecurity:
    """The keys and TLS files; one warning line when a non-loopback address is served without a key."""
    from kvevents.consumers.service.auth import HttpSecurity, is_loopback_host

    try:
        security = HttpSecurity(api_key, read_only_key, tls_cert, tls_key)
        security.check_tls()
    except ValueError as exc:
        user_error(str(exc))
    if not security.keyed and not is_loopback_host(host):
        sys.stderr.write(
            f"kvevents: warning: route's HTTP front on {host} without --api-key: anyone who can reach it can "
            "score, proxy and read every worker's state; use loopback or --api-key (README: Auth and TLS)\n"
        )
        sys.stderr.flush()
    return security


def worker_urls(proxy: bool, specs: Sequence[str]) -> list[WorkerUrl]:
    """--worker-url specs, parsed (they need --proxy, and --proxy needs one)."""
    from kvevents.consumers.service.proxy_targets import parse_worker_url

    if specs and not proxy:
        user_error("--worker-url is for the proxy: add --proxy")
    if proxy and not specs:
        user_error("--proxy needs --worker-url NAME=http://HOST:PORT for every worker it may send to")
    try:
        return [parse_worker_url(s) for s in specs]
    except ValueError as exc:
        user_error(str(exc))


def make_proxy(
    service: RouterService,
    urls: Sequence[WorkerUrl],
    upstream_timeout: float,
    max_connections: int,
    security: HttpSecurity,
) -> Optional[Proxy]:
    """The proxy over `service` (None without --worker-url); the client's Authorization header is
    passed on to the workers only when the router checks no key of its own."""
    if not urls:
        return None
    from kvevents.consumers.service.proxy import Proxy, ProxyConfig

    try:
        config = ProxyConfig(read_timeout_s=upstream_timeout, max_connections=max_connections)
        return Proxy(service, urls, config, forward_authorization=not security.keyed)
    except ValueError as exc:
        user_error(f"--proxy: {exc}")


def served(proxy: Optional[Proxy]) -> list[str]:
    """The banner's lines of what is served (each within 80 columns after the command's tag)."""
    lines = ["/ status page, POST /score, /workers, /metrics, /openapi.json"]
    if proxy is not None:
        lines.append("proxy " + ", ".join(e.split()[-1] for e in proxy.endpoints))  # the paths, no methods
    return lines


@dataclass(frozen=True)
class AuthFlags:
    """The HTTP front's keys (flag or environment variable) and TLS files."""

    api_key: Optional[str] = flag(
        None,
        "--api-key",
        envvar=API_KEY_ENV,
        help="A bearer token every endpoint but /healthz requires (Authorization: Bearer KEY).",
    )
    read_only_key: Optional[str] = flag(
        None,
        "--read-only-key",
        envvar=READ_ONLY_KEY_ENV,
        help="A second token for GET /workers, /status.json, / and /metrics only (no copies by adapter).",
    )
    tls_cert: Optional[str] = flag(None, "--tls-cert", help="Serve HTTPS with this PEM certificate (chain).")
    tls_key: Optional[str] = flag(None, "--tls-key", help="The PEM private key of --tls-cert.")

    def security(self, host: str) -> HttpSecurity:
        """front_security of these flags for a front served on `host`."""
        return front_security(self.api_key, self.read_only_key, self.tls_cert, self.tls_key, host)


@dataclass(frozen=True)
class ProxyFlags:
    """Whether route also proxies OpenAI requests, where to, and how long it waits for a worker."""

    proxy: bool = flag(
        False,
        "--proxy",
        help="Also serve OpenAI's /v1/completions, /v1/chat/completions and /v1/models, each request sent to "
        "the best-ranked worker (README: The proxy).",
    )
    worker_url: list[str] = flag(
        [],
        "--worker-url",
        metavar="NAME=URL",
        help="NAME=http://HOST:PORT: where the proxy sends publisher NAME's requests (every dp rank); "
        "NAME#dpR=URL for rank R alone. Repeatable.",
    )
    upstream_timeout: float = flag(
        600.0, "--upstream-timeout", help="Proxy: seconds to wait for a worker's next byte (> 0)."
    )

    def urls(self) -> list[WorkerUrl]:
        """The --worker-url specs, parsed (worker_urls: they need --proxy, and --proxy needs one)."""
        return worker_urls(self.proxy, self.worker_url)
