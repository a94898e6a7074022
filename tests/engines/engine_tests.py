"""What the engine tests share: each engine's venv (scripts/engine_env.sh) and one driver run per engine.

An engine and kvevents' suite cannot share one interpreter (their pins differ), so each engine's
checks run as one subprocess inside its venv (tests/engines/*_driver.py) and report named checks;
the tests here assert them. No venv (registry unreachable, install failed): the tests skip with
one line saying so. Each such module names its run `AHEAD = DriverRun(...)`: under pytest-xdist
it starts ahead of the tests (tests/helpers/ahead.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ahead

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REPORT_TAG = "KVEVENTS-REPORT "
UNREACHABLE = 3  # scripts/engine_env.sh: the package registry cannot be reached


@dataclass(frozen=True)
class DriverRun:
    """One driver run a test module's checks come from: tests/engines/{driver}_driver.py inside
    the `engine` venv, with `env` added to the environment."""

    engine: str
    driver: str
    env: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.driver

    def outcome(self, tmp: Path, started: Callable[[subprocess.Popen[str]], None] | None = None) -> dict:
        return driver_outcome(self, tmp, started)


def engine_python(engine: str) -> tuple[str | None, str]:
    """The engine venv's interpreter, building the venv if needed, or (None, why it cannot be had)."""
    try:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "engine_env.sh"), engine], capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired:
        return None, f"{engine} venv: scripts/engine_env.sh did not finish within 900 s"
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    why = lines[-1] if lines else f"exit {proc.returncode}"
    if proc.returncode == UNREACHABLE:
        return None, f"{engine}: {why}"
    if proc.returncode != 0:
        return None, f"{engine} venv cannot be built: {why}"
    return proc.stdout.strip().splitlines()[-1], ""


def driver_outcome(run: DriverRun, tmp: Path, started: Callable[[subprocess.Popen[str]], None] | None = None) -> dict:
    """Run the driver once: {"report": its report}, {"skip": why} (no venv) or {"fail": why}.
    `started` is given the driver's process (so a session that is interrupted can stop it)."""
    python, why = engine_python(run.engine)
    if python is None:
        return {"skip": why}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "KVEVENTS_CURVE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)])
    env.update(dict(run.env))
    cmd = [python, str(HERE / f"{run.driver}_driver.py"), str(tmp)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if started is not None:
        started(proc)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"fail": f"{run.driver} driver did not finish within 600 s:\n{err[-3000:]}"}
    for line in reversed(out.splitlines()):
        if line.startswith(REPORT_TAG):
            return {"report": json.loads(line[len(REPORT_TAG) :])}
    return {"fail": f"{run.engine} driver exited {proc.returncode} without a report:\n{err[-3000:]}"}


def run_driver(run: DriverRun, tmp_path_factory: pytest.TempPathFactory, config: pytest.Config) -> dict[str, Any]:
    """The driver's report (checks, stand-ins, figures): the run started ahead of the tests when
    there is one (tests/helpers/ahead.py), else one run now; skips without the engine's venv."""
    outcome = ahead.take(config, run) or run.outcome(tmp_path_factory.mktemp(run.driver))
    report: dict[str, Any] = ahead.result(outcome)
    return report


def assert_checks(report: dict[str, Any], *names: str) -> None:
    """Every named check ran and passed; the failure message lists each failed or missing one."""
    checks = report["checks"]
    bad = [f"{n}: never ran" for n in names if n not in checks]
    bad += [f"{n}: {checks[n]['detail']}" for n in names if n in checks and not checks[n]["ok"]]
    assert not bad, "\n".join(bad)
