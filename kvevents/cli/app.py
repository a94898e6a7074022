"""The typer application and the one place that turns errors into exit codes.

Exit codes: 0 ok, 1 a check failed, 2 a user error (bad flag, bad input, unreachable file).
Every error is one line on stderr; a traceback is never shown. The commands are registered on
`app` by kvevents.cli (its module map); this module imports none of them.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import typer

from kvevents.cli import helpfmt
from kvevents.errors import KVEventsError

helpfmt.install()  # the help's placeholders and type column, before any command is built

app = typer.Typer(
    name="kvevents",
    help="KV-cache events: the hash contract, a reference cache, publisher, consumers and tools.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: The headings of `kvevents --help`, in the order it lists them (kvevents.cli files each command).
MAIN_JOB, ENGINE_SIDE, CONSUMER_SIDE, LOGS, CONTRACT = (
    "The main job",
    "Engine side: publish",
    "Consumer side: subscribe, check",
    "Record logs",
    "The contract",
)

#: `--publisher` of route, bridge and record: the form in words that fit a help column of 80 columns.
PUBLISHER_FORM = "NAME=ENDPOINT, or NAME=ENDPOINT,REPLAY with its replay endpoint"


def publisher_option(default: Any, each: str) -> Any:
    """`--publisher` as route, bridge and record take it, once per `each` (publisher, engine)."""
    return typer.Option(default, "--publisher", help=f"{PUBLISHER_FORM}; repeat for every {each}.")


def _show_version(value: bool) -> None:
    if value:
        from kvevents.cli.version import version as print_version  # `kvevents version` says the same

        print_version()
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_show_version,
        is_eager=True,
        help="Print the version (and the hashing path) and exit.",
    ),
) -> None:
    """KV-cache events: the hash contract, a reference cache, publisher, consumers and tools."""


class UserError(Exception):
    """A mistake in what the user asked for: one line on stderr, exit 2."""


class CheckFailed(Exception):
    """A check that ran and failed: one line on stderr, exit 1."""


def user_error(message: str) -> NoReturn:
    raise UserError(message)


def _say(message: str) -> None:
    line = " ".join(str(message).split())
    sys.stderr.write(f"kvevents: {line}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the app, map every failure onto one stderr line and an exit code."""
    try:
        rv = app(args=argv, prog_name="kvevents", standalone_mode=False)
    except UserError as exc:
        _say(f"error: {exc}")
        return _exit(2)
    except CheckFailed as exc:
        _say(f"check failed: {exc}")
        return _exit(1)
    except KeyboardInterrupt:
        _say("interrupted")
        return _exit(130)
    except Exception as exc:  # noqa: BLE001 - the one place every error becomes an exit code
        return _exit(_report(exc))
    return _exit(rv if isinstance(rv, int) else 0)


def _report(exc: Exception) -> int:
    """Exit code for an exception from typer (typer >= 0.29 raises its own classes: usage errors
    are TyperException subclasses) or from the library."""
    if isinstance(exc, typer.Exit):
        return int(exc.exit_code or 0)
    if isinstance(exc, typer.Abort):
        _say("aborted")
        return 130
    if isinstance(exc, typer.TyperException):  # usage errors: bad flag, missing argument
        message = exc.format_message()
        if message:  # no-args-is-help already printed the help text
            _say(f"error: {message}")
        return 2
    if isinstance(exc, (KVEventsError, ValueError, OSError)):
        _say(f"error: {exc}")
        return 2
    _say(f"internal error: {type(exc).__name__}: {exc}")
    return 1


def _exit(code: int) -> int:
    if __name__ != "__main__":
        sys.exit(code)
    return code  # pragma: no cover
