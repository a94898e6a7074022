"""`kvevents keys generate` and `kvevents keys sign-key`, and the CURVE flags the other commands share (kvevents.zeromq.security).

Publishers (serve) take `--curve-secret FILE [--curve-allow DIR]`; consumers take
`--curve-server-key FILE [--curve-client-cert FILE]` (tail, doctor: one publisher) or
`--curve-server-key [NAME=]FILE ...` (route, record, bridge: FILE for every --publisher, NAME=FILE for one).
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Optional, Sequence

import typer

from kvevents.cli.app import app, user_error

keys_app = typer.Typer(
    name="keys",
    help="CURVE keypairs for opt-in encryption and authentication on the wire; HMAC keys for JetStream.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(keys_app, name="keys")

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


@keys_app.command("generate")
def generate_cmd(
    directory: str = typer.Argument(..., help="Directory to write the keypair in (created if missing)."),
    name: str = typer.Option("kvevents", "--name", help="File name: NAME.key (public) and NAME.key_secret (secret)."),
) -> None:
    """Write a CURVE keypair in pyzmq's certificate format: NAME.key to hand out, NAME.key_secret to keep."""
    from kvevents.zeromq.security import generate_keypair

    try:
        public, secret = generate_keypair(directory, name)
    except (OSError, ValueError) as exc:
        user_error(str(exc))
    sys.stdout.write(f"public {public}\nsecret {secret}\n")
    sys.stdout.flush()


@keys_app.command("sign-key")
def sign_key_cmd(
    path: str = typer.Argument(..., help="The key file to write (created 0600)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a new random HMAC key for a JetStream stream (`--sign-key FILE` of bridge, route, record,
    fetch and doctor --nats): give it to the bridges and consumers only."""
    from kvevents.jetstream.signing import write_key_file

    try:
        key = write_key_file(path, force=force)
    except FileExistsError:
        user_error(f"{path!r} exists (--force to overwrite it)")
    except (OSError, ValueError) as exc:
        user_error(f"sign-key {path!r}: {exc}")
    sys.stdout.write(f"sign key {path} (key id {key.key_id})\n")
    sys.stdout.flush()


def curve_server(secret: Optional[str], allow: Optional[str]) -> Any:
    """--curve-secret / --curve-allow -> (secret file, allow dir) checked now (None, None when off)."""
    from kvevents.zeromq.security import CurveServer

    if secret is None:
        if allow is not None:
            user_error("--curve-allow needs --curve-secret (the server's certificate)")
        return None
    try:
        return CurveServer.from_files(secret, allow)
    except ValueError as exc:
        user_error(f"--curve-secret/--curve-allow: {exc}")


def curve_clients(server_keys: Sequence[str], client_cert: Optional[str], names: Iterable[str]) -> dict[str, Any]:
    """Source name -> CurveClient from --curve-server-key [NAME=]FILE ... and --curve-client-cert."""
    from kvevents.zeromq.security import CurveClient

    names = [str(n) for n in names]
    if not server_keys:
        if client_cert is not None:
            user_error("--curve-client-cert needs --curve-server-key (the publisher's public certificate)")
        return {}
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


def show_plain_bind_once() -> None:
    """The publishers' plain-bind warning, once per command, as a `kvevents: warning:` line."""
    import logging

    from kvevents.zeromq.security import OnceFilter

    logger = logging.getLogger("kvevents.zeromq.publisher")
    if any(isinstance(f, OnceFilter) for h in logger.handlers for f in h.filters):
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("kvevents: warning: %(message)s"))
    h.setLevel(logging.WARNING)
    h.addFilter(OnceFilter())
    logger.addHandler(h)
    logger.propagate = False
