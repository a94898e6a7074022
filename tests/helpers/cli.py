"""Running the `kvevents` command line in tests, the one way each:

- `invoke`: in-process through the real entry point (`kvevents.cli.main`, which maps every error
  to one stderr line and an exit code) inside typer's `CliRunner` isolation. For text-only
  commands: help, versions, hashes, golden checks, usage errors that need no socket.
- `run` / `spawn`: a `python -m kvevents` subprocess, for commands that serve, connect or are
  killed; the calling test must carry `@pytest.mark.subprocess` (checked).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
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


def invoke(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """`kvevents ARGS` in this process: its exit code, stdout and stderr (help at 120 columns, no
    colour); never a traceback on stderr."""
    from kvevents.cli import main

    runner = CliRunner()
    with runner.isolation(env={**_ENV, **(env or {})}) as (out, err, _mixed):
        try:
            code: Any = main(list(args))
        except SystemExit as exc:
            code = exc.code
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
