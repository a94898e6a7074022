"""`kvevents keys generate` (a CURVE keypair, kvevents.zeromq.security) and `kvevents keys sign-key`
(an HMAC key for a JetStream stream, kvevents.jetstream.signing); the CURVE flags the other commands
take are in kvevents.cli.options."""

from __future__ import annotations

import os
import sys

import typer

from kvevents.cli.app import user_error

keys_app = typer.Typer(
    name="keys",
    help="CURVE keypairs for opt-in encryption and authentication on the wire; HMAC keys for JetStream.",
    no_args_is_help=True,
    add_completion=False,
)


@keys_app.command("generate")
def generate_cmd(
    directory: str = typer.Argument(..., help="Directory to write the keypair in (created if missing)."),
    name: str = typer.Option("kvevents", "--name", help="File name: NAME.key (public) and NAME.key_secret (secret)."),
) -> None:
    """Write a CURVE keypair in pyzmq's certificate format: NAME.key to hand out, NAME.key_secret to keep."""
    from kvevents.zeromq.security import generate_keypair

    if os.path.exists(directory) and not os.path.isdir(directory):
        user_error(f"{directory} exists and is not a directory: give the directory to write NAME.key in")
    try:
        public, secret = generate_keypair(directory, name)
    except ValueError as exc:
        user_error(str(exc))
    except OSError as exc:  # no permission, a parent that is a file, a full disk: said in words
        where = exc.filename if exc.filename is not None else directory
        user_error(f"cannot write the keypair in {directory}: {where}: {exc.strerror or exc}")
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
