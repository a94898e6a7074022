"""Flags several commands share, and what they turn into: checked endpoints, HOST:PORT, a log file
to write, CURVE keys (kvevents.zeromq.security) and NATS options (kvevents.jetstream.link).

Publishers (serve, replay) take `--curve-secret FILE [--curve-allow DIR]`; consumers take
`--curve-server-key FILE [--curve-client-cert FILE]` (tail, doctor, fetch: one publisher) or
`--curve-server-key [NAME=]FILE ...` (route, record, bridge: FILE for every --publisher, NAME=FILE for one).
Every `--nats` command (route, record, bridge, fetch, doctor) takes the same connection flags
(`@nats_flags`: --creds, --tls-ca, --tls-cert, --tls-key, --give-up-after, as one `NatsFlags`); the
consumers' trust flags come with them (`@nats_feed_flags`: --sign-key, --insecure, --max-sources for
route, record, fetch; `@nats_signed_flags`: the first two, for doctor). The CURVE pairs are bundles
too (kvevents.cli.flag_groups): `CurveClients` (route, record, bridge), `CurveServerFlags` (serve,
relay, replay). A bad value is one `user_error` line (exit 2).
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar

import typer

from kvevents.cli.app import user_error
from kvevents.cli.flag_groups import flag, flag_of, inject
from kvevents.cli.nats_trust import INSECURE_HELP, MAX_SOURCES_HELP, SIGN_KEY_HELP, bus_trust
from kvevents.cli.output import log_to_stderr, say

SERVER_KEY_HELP = "CURVE: the publisher's public certificate (NAME.key from `kvevents keys generate`)."
SERVER_KEYS_HELP = (
    "CURVE: the publishers' public certificate (NAME.key from `kvevents keys generate`); "
    "NAME=FILE for one --publisher, a bare FILE for every other one (repeatable)."
)
CLIENT_CERT_HELP = (
    "CURVE: this client's certificate with its secret key (NAME.key_secret); needed when the "
    "publisher has an allow-list (default: a throwaway keypair)."
)
SECRET_HELP = "CURVE: serve encrypted, with this server certificate (NAME.key_secret); consumers need NAME.key."
ALLOW_HELP = (
    "CURVE: only clients whose public certificate (*.key) is in this directory may connect "
    "(default with --curve-secret: any client holding the server's public key)."
)
CREDS_HELP = "NATS credentials file (JWT + NKey seed, decentralized auth)."
TLS_CA_HELP = "PEM file of the CA that signed the NATS server's certificate."
TLS_CERT_HELP = "PEM client certificate (mutual TLS)."
TLS_KEY_HELP = "PEM key of --tls-cert."
GIVE_UP_HELP = "With --nats: exit 2 if NATS is still unreachable after S seconds (default: retry forever)."

# option declarations reused as defaults (typer copies them per command)
CURVE_SERVER_KEY = typer.Option(None, "--curve-server-key", help=SERVER_KEY_HELP)
CURVE_CLIENT_CERT = typer.Option(None, "--curve-client-cert", help=CLIENT_CERT_HELP)
CURVE_SECRET = typer.Option(None, "--curve-secret", help=SECRET_HELP)
CURVE_ALLOW = typer.Option(None, "--curve-allow", help=ALLOW_HELP)
NATS_STREAM = typer.Option("kvevents", "--stream", help="With --nats: the JetStream stream name.")


def check_endpoint(what: str, endpoint: Optional[str], *, empty_ok: bool = False) -> None:
    """A malformed ZeroMQ address is a usage error naming its flag (None, and '' when `empty_ok`,
    mean not given: nothing to check)."""
    from kvevents.zeromq.wire import check_endpoint as check

    if endpoint is not None and (endpoint or not empty_ok):
        try:
            check(endpoint)
        except ValueError as exc:
            user_error(f"{what}: {exc}")


def host_port(flag: str, spec: str) -> tuple[str, int]:
    """HOST:PORT (port 0..65535, [v6] brackets stripped) from a flag's value."""
    host, sep, port = spec.rpartition(":")
    if not sep or not host:
        user_error(f"{flag} {spec!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    try:
        num = int(port)
    except ValueError:
        user_error(f"{flag} {spec!r}: port {port!r} is not a number")
    if not 0 <= num <= 65535:
        user_error(f"{flag} {spec!r}: port must be in 0..65535")
    return host.strip("[]"), num


def check_log_target(path: str, allowed: bool) -> None:
    """A record log to write: a regular file name, existing only when `allowed` (--append/--force)."""
    if os.path.isdir(path):
        user_error(f"{path} is a directory: give a file name for the log, e.g. {os.path.join(path, 'capture.kvlog')}")
    if os.path.exists(path) and not os.path.isfile(path):
        user_error(f"{path} is not a regular file (a FIFO, socket or device): give a file name for the log")
    if not allowed and os.path.exists(path) and os.path.getsize(path) > 0:
        user_error(f"{path} exists: use --append to continue it or --force to overwrite it")


# ---------------------------------------------------------------- CURVE


def curve_server(secret: Optional[str], allow: Optional[str]) -> Any:
    """--curve-secret / --curve-allow -> a CurveServer checked now (None when off)."""
    from kvevents.zeromq.security import CurveServer

    if secret is None:
        if allow is not None:
            user_error("--curve-allow needs --curve-secret (the server's certificate)")
        return None
    try:
        return CurveServer.from_files(secret, allow)
    except ValueError as exc:
        user_error(f"--curve-secret/--curve-allow: {exc}")


def _split_server_keys(server_keys: Sequence[str], names: list[str]) -> tuple[Optional[str], dict[str, str]]:
    """--curve-server-key values -> (the bare FILE for every source, {name: FILE})."""
    default: Optional[str] = None
    per: dict[str, str] = {}
    for spec in server_keys:
        name, sep, path = spec.partition("=")
        if sep and name in names:
            per[name] = path
        elif sep and "/" not in name and not name.endswith(".key"):
            user_error(f"--curve-server-key {spec!r}: no --publisher named {name!r} (names: {', '.join(names)})")
        else:
            if default is not None:
                user_error("--curve-server-key: give one bare FILE (for every publisher) and NAME=FILE for the others")
            default = spec
    return default, per


def curve_clients(server_keys: Sequence[str], client_cert: Optional[str], names: Iterable[str]) -> dict[str, Any]:
    """Source name -> CurveClient from --curve-server-key [NAME=]FILE ... and --curve-client-cert."""
    from kvevents.zeromq.security import CurveClient

    names = [str(n) for n in names]
    if not server_keys:
        if client_cert is not None:
            user_error("--curve-client-cert needs --curve-server-key (the publisher's public certificate)")
        return {}
    default, per = _split_server_keys(server_keys, names)
    out = {}
    try:
        for n in names:
            key_file = per.get(n, default)
            if key_file is not None:
                out[n] = CurveClient.from_files(key_file, client_cert)
    except ValueError as exc:
        user_error(f"--curve-server-key/--curve-client-cert: {exc}")
    return out


def curve_client(server_key: Optional[str], client_cert: Optional[str]) -> Any:
    """One publisher's CurveClient from --curve-server-key FILE / --curve-client-cert (None when off)."""
    return curve_clients([server_key] if server_key else [], client_cert, ["-"]).get("-")


def with_curve(sources: list[Any], server_keys: Sequence[str], client_cert: Optional[str]) -> list[Any]:
    """Set each Source's `curve` from the flags (in place); returns the sources."""
    if not sources and (server_keys or client_cert):
        user_error("--curve-server-key/--curve-client-cert apply to --publisher sources (ZeroMQ), not to --nats")
    clients = curve_clients(server_keys, client_cert, [s.name for s in sources])
    for s in sources:
        if s.name in clients:
            s.curve = clients[s.name]
    return sources


@dataclass(frozen=True)
class CurveClients:
    """`--curve-server-key [NAME=]FILE ... --curve-client-cert FILE` of a command over several
    publishers (route, record, bridge)."""

    curve_server_key: list[str] = flag([], "--curve-server-key", help=SERVER_KEYS_HELP)
    curve_client_cert: Optional[str] = flag_of(CURVE_CLIENT_CERT)

    def apply(self, sources: list[Any]) -> list[Any]:
        """Each Source's `curve` set from the flags (with_curve: in place); returns the sources."""
        return with_curve(sources, self.curve_server_key, self.curve_client_cert)


@dataclass(frozen=True)
class CurveServerFlags:
    """`--curve-secret FILE [--curve-allow DIR]` of a publishing command (serve, relay, replay)."""

    curve_secret: Optional[str] = flag_of(CURVE_SECRET)
    curve_allow: Optional[str] = flag_of(CURVE_ALLOW)

    def server(self) -> Any:  # CurveServer | None
        """The CurveServer of the flags, its files checked now (curve_server: bad files exit 2)."""
        return curve_server(self.curve_secret, self.curve_allow)


# ---------------------------------------------------------------- NATS


def nats_options(
    url: str,
    creds: Optional[str] = None,
    tls_ca: Optional[str] = None,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
    name: str = "kvevents",
    tls_flag: str = "--tls-",
) -> Any:  # NatsOptions
    """NatsOptions from the command line; a malformed URL or a missing file is a user error (exit 2),
    the TLS flags named as this command spells them (`tls_flag`).

    Credentials and TLS files not given as flags come from KVEVENTS_NATS_CREDS, KVEVENTS_NATS_TLS_CA,
    KVEVENTS_NATS_TLS_CERT and KVEVENTS_NATS_TLS_KEY (so route/record/fetch/doctor take them too).
    """
    from kvevents.jetstream.link import NatsOptions

    creds = creds or os.environ.get("KVEVENTS_NATS_CREDS") or None
    tls_ca = tls_ca or os.environ.get("KVEVENTS_NATS_TLS_CA") or None
    tls_cert = tls_cert or os.environ.get("KVEVENTS_NATS_TLS_CERT") or None
    tls_key = tls_key or os.environ.get("KVEVENTS_NATS_TLS_KEY") or None
    t = tls_flag
    for given, path in (("--creds", creds), (f"{t}ca", tls_ca), (f"{t}cert", tls_cert), (f"{t}key", tls_key)):
        if path is not None and not os.path.isfile(path):
            user_error(f"{given} {path!r}: no such file")
    if tls_key and not tls_cert:
        user_error(f"{t}key needs {t}cert")
    opts = NatsOptions(url, creds=creds, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, name=name)
    try:
        opts.servers()
    except ValueError as exc:
        user_error(str(exc))
    return opts


NATS_PANEL = "NATS connection"  # where --help shows the flags that apply to --nats only
DEFAULT_MAX_SOURCES = 4096
SIGN_KEY = typer.Option(None, "--sign-key", help="With --nats: " + SIGN_KEY_HELP, rich_help_panel=NATS_PANEL)
INSECURE = typer.Option(False, "--insecure", help="With --nats: " + INSECURE_HELP, rich_help_panel=NATS_PANEL)
MAX_SOURCES = typer.Option(
    DEFAULT_MAX_SOURCES, "--max-sources", help="With --nats: " + MAX_SOURCES_HELP, rich_help_panel=NATS_PANEL
)


@dataclass(frozen=True)
class NatsFlags:
    """The NATS flags of one command line (each None when not given); `tls_flag` is how this command
    spells its TLS flags (`--tls-` where free, `--nats-tls-` where `--tls-*` serve HTTPS). The trust
    flags (sign_key, insecure, max_sources) are set by `@nats_feed_flags` / `@nats_signed_flags`."""

    creds: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    give_up_after: Optional[float] = None
    tls_flag: str = "--tls-"
    sign_key: Optional[str] = None
    insecure: bool = False
    max_sources: int = DEFAULT_MAX_SOURCES

    def given(self) -> list[str]:
        t = self.tls_flag
        flags = ("--creds", f"{t}ca", f"{t}cert", f"{t}key", "--give-up-after")
        values = (self.creds, self.tls_ca, self.tls_cert, self.tls_key, self.give_up_after)
        return [f for f, v in zip(flags, values) if v is not None]

    def check(self, nats_url: Optional[str]) -> None:
        """Flags without --nats, or a give-up time <= 0: one line, exit 2."""
        if nats_url is None and self.given():
            given = self.given()
            verb = "applies" if len(given) == 1 else "apply"
            user_error(f"{', '.join(given)} {verb} to --nats URL (NATS JetStream): add --nats or leave it out")
        if self.give_up_after is not None and not self.give_up_after > 0:
            user_error(f"--give-up-after must be > 0 seconds, got {self.give_up_after:g}")

    def options(self, url: str, prog: str) -> Any:  # NatsOptions
        """NatsOptions for `kvevents PROG --nats URL` with these flags (nats_options: checked)."""
        self.check(url)
        name = f"kvevents-{prog}"
        return nats_options(url, self.creds, self.tls_ca, self.tls_cert, self.tls_key, name, self.tls_flag)

    def bus_key(self, prog: str) -> Any:  # SignKey | None
        """The SignKey of --sign-key (or $KVEVENTS_NATS_SIGN_KEY); None with --insecure; neither: exit 2."""
        return bus_trust(prog, self.sign_key, self.insecure)


F = TypeVar("F", bound=Callable[..., Any])
_NATS_TLS = (("ca", TLS_CA_HELP), ("cert", TLS_CERT_HELP), ("key", TLS_KEY_HELP))
_TRUST = (("sign_key", Optional[str], SIGN_KEY), ("insecure", bool, INSECURE), ("max_sources", int, MAX_SOURCES))


def _nats_flag_params(tls_flag: str, trust: int) -> list[inspect.Parameter]:
    """The first `trust` trust flags, then each NATS connection flag (TLS spelled `tls_flag`)."""
    opt = functools.partial(typer.Option, rich_help_panel=NATS_PANEL)
    tls = [(f"nats_tls_{n}", Optional[str], opt(None, f"{tls_flag}{n}", metavar="FILE", help=h)) for n, h in _NATS_TLS]
    params = [
        *_TRUST[:trust],
        ("nats_creds", Optional[str], opt(None, "--creds", metavar="FILE", help=CREDS_HELP)),
        *tls,
        ("nats_give_up_after", Optional[float], opt(None, "--give-up-after", metavar="S", help=GIVE_UP_HELP)),
    ]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD  # inject gives them the placeholder's kind
    return [inspect.Parameter(n, kind, default=o, annotation=a) for n, a, o in params]


def _serves_https(fn: Callable[..., Any]) -> bool:
    """Whether the command has a `--tls-cert` of its own (route's HTTPS front)."""
    params = inspect.signature(fn).parameters.values()
    return any("--tls-cert" in (getattr(p.default, "param_decls", None) or ()) for p in params)


def _with_nats_flags(fn: F, trust: int) -> F:
    """`fn` taking the NATS flags (the first `trust` trust flags first) as `nats_flags: NatsFlags`."""
    tls_flag = "--nats-tls-" if _serves_https(fn) else "--tls-"

    def build(
        nats_creds: Optional[str] = None,
        nats_tls_ca: Optional[str] = None,
        nats_tls_cert: Optional[str] = None,
        nats_tls_key: Optional[str] = None,
        nats_give_up_after: Optional[float] = None,
        **trust_flags: Any,
    ) -> NatsFlags:
        return NatsFlags(
            nats_creds, nats_tls_ca, nats_tls_cert, nats_tls_key, nats_give_up_after, tls_flag, **trust_flags
        )

    return inject(fn, "nats_flags", _nats_flag_params(tls_flag, trust), build)


def nats_flags(fn: F) -> F:
    """Give a command the NATS connection flags in place of its `nats_flags: NatsFlags` parameter. A
    command whose own `--tls-cert` serves HTTPS (route) gets them as `--nats-tls-ca/-cert/-key`
    (apply its HTTP flags' decorator first, below this one)."""
    return _with_nats_flags(fn, 0)


def nats_signed_flags(fn: F) -> F:
    """`@nats_flags` after `--sign-key FILE` and `--insecure` (a command that checks signatures: doctor)."""
    return _with_nats_flags(fn, 2)


def nats_feed_flags(fn: F) -> F:
    """`@nats_flags` after `--sign-key`, `--insecure` and `--max-sources` (a command that reads the
    stream as a JetStreamFeed: route, record, fetch)."""
    return _with_nats_flags(fn, 3)


def jetstream_feed(url: str, stream: str, prog: str, flags: NatsFlags, **options: object) -> Any:  # JetStreamFeed
    """A JetStreamFeed for `route --nats` / `record --nats` / `fetch --nats` (one-line notice while
    NATS is unreachable; with --give-up-after, exit 2 once it has been for that long; no --sign-key
    and no --insecure: exit 2)."""
    from kvevents.jetstream.feed import JetStreamFeed

    opts = flags.options(url, prog)
    key = flags.bus_key(prog)
    if flags.give_up_after is not None:
        options["give_up_after_s"] = flags.give_up_after
    options["max_sources"] = flags.max_sources
    log_to_stderr()
    try:
        return JetStreamFeed(opts, stream, on_unreachable=lambda m: say(prog, m), sign_key=key, **options)  # type: ignore[arg-type]
    except ValueError as exc:
        user_error(str(exc))
