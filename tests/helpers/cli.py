"""Running the `kvevents` command line in tests, the one way each:

- `invoke`: in-process through the real entry point (`kvevents.cli.main`, which maps every error
  to one stderr line and an exit code) inside typer's `CliRunner` isolation. For text-only
  commands (help, versions, hashes, golden checks, log files, usage errors) and for client
  commands that end by themselves (`tail --count`, `record --count`, `fetch`, `doctor`,
  `conformance stream`): no interpreter to start, the same code path from argv on.
- `run` / `spawn`: a `python -m kvevents` subprocess, for commands that serve, connect or are
  killed; the calling test must carry `@pytest.mark.subprocess` (checked).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tests.helpers.marks import require

KVEVENTS: list[str] = [sys.executable, "-m", "kvevents"]
_ENV = {"COLUMNS": "120", "NO_COLOR": "1"}


@dataclass(frozen=True)
class CliResult:
    """What an in-process run printed and returned (the fields of a CompletedProcess)."""

    returncode: int
    stdout: str
    stderr: str


@contextmanager
def _process_state_kept() -> Iterator[None]:
    """What a command changes for its process, put back after it: the `kvevents` loggers' handlers
    (bound to the runner's streams), their levels and propagation, the SIGINT/SIGTERM handlers."""
    manager = logging.Logger.manager
    before = {
        name: (list(lg.handlers), lg.propagate, lg.level)
        for name, lg in manager.loggerDict.items()
        if isinstance(lg, logging.Logger) and name.split(".")[0] == "kvevents"
    }
    signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for name, lg in list(manager.loggerDict.items()):
            if isinstance(lg, logging.Logger) and name.split(".")[0] == "kvevents":
                handlers, lg.propagate, level = before.get(name, ([], True, logging.NOTSET))
                lg.handlers = handlers
                lg.setLevel(level)
        for sig, handler in signals.items():
            signal.signal(sig, handler)


def invoke(*args: str, env: dict[str, str | None] | None = None, timeout: float | None = None) -> CliResult:
    """`kvevents ARGS` in this process: its exit code, stdout and stderr (help at 120 columns, no
    colour); never a traceback on stderr. For commands that end by themselves (never one a test
    must signal); the loggers and signal handlers a command sets up are undone after it.
    `env`: variables set for the run (None: unset). `timeout`: a command that should have ended but still runs then gets SIGINT (its Ctrl-C:
    exit 130, which fails the test's exit-code check) instead of hanging the test, e.g. a
    `route` that starts serving because a bad option was let through."""
    from kvevents.cli import main

    runner = CliRunner()
    watchdog = None if timeout is None else threading.Timer(timeout, os.kill, (os.getpid(), signal.SIGINT))
    with _process_state_kept(), runner.isolation(env={**_ENV, **(env or {})}) as (out, err, _mixed):
        if watchdog is not None:
            watchdog.start()
        try:
            code: Any = main(list(args))
        except SystemExit as exc:
            code = exc.code
        finally:
            if watchdog is not None:
                watchdog.cancel()
        sys.stdout.flush()
        sys.stderr.flush()
        result = CliResult(int(code or 0), out.getvalue().decode(), err.getvalue().decode())
    assert "Traceback" not in result.stderr, result.stderr
    return result


def argv(*args: str, script: bool = False) -> list[str]:
    """The command line of a `kvevents` subprocess (the installed console script with `script=True`)."""
    require("subprocess")
    exe = shutil.which("kvevents") if script else None
    return [exe, *args] if exe else [*KVEVENTS, *args]


def run(
    *args: str,
    timeout: float = 60,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    script: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`kvevents ARGS` as a subprocess, to its end; never a traceback on stderr."""
    r = subprocess.run(argv(*args, script=script), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def spawn(*args: str, **popen: Any) -> subprocess.Popen[str]:
    """`kvevents ARGS` started in the background with text pipes for stdout and stderr."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen(argv(*args), **popen)


def one_line_error(result: CliResult | subprocess.CompletedProcess[str], code: int = 2, needle: str = "") -> str:
    """Assert the CLI failed as the rules say (exit `code`, one stderr line, no traceback); the line."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    line = result.stderr[:-1]
    assert needle in line, (needle, line)
    return line
