"""What the engine tests share: each engine's venv (scripts/engine_env.sh) and one driver run per engine.

An engine and kvevents' suite cannot share one interpreter (their pins differ), so each engine's
checks run as one subprocess inside its venv (tests/engines/*_driver.py) and report named checks;
the tests here assert them. No venv (registry unreachable, install failed): the tests skip with
one line saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REPORT_TAG = "KVEVENTS-REPORT "
UNREACHABLE = 3  # scripts/engine_env.sh: the package registry cannot be reached


def engine_python(engine: str) -> str:
    """The engine venv's interpreter, building the venv if needed; skips when it cannot be had."""
    try:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "engine_env.sh"), engine], capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"{engine} venv: scripts/engine_env.sh did not finish within 900 s")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    why = lines[-1] if lines else f"exit {proc.returncode}"
    if proc.returncode == UNREACHABLE:
        pytest.skip(f"{engine}: {why}")
    if proc.returncode != 0:
        pytest.skip(f"{engine} venv cannot be built: {why}")
    return proc.stdout.strip().splitlines()[-1]


def run_driver(
    engine: str, tmp: Path, extra_env: dict[str, str] | None = None, *, driver: str | None = None
) -> dict[str, Any]:
    """Run tests/engines/{driver or engine}_driver.py in the engine's venv; its report (checks, stand-ins, figures)."""
    python = engine_python(engine)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "KVEVENTS_CURVE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)])
    env.update(extra_env or {})
    proc = subprocess.run(
        [python, str(HERE / f"{driver or engine}_driver.py"), str(tmp)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(REPORT_TAG):
            return json.loads(line[len(REPORT_TAG) :])
    pytest.fail(f"{engine} driver exited {proc.returncode} without a report:\n{proc.stderr[-3000:]}")


def assert_checks(report: dict[str, Any], *names: str) -> None:
    """Every named check ran and passed; the failure message lists each failed or missing one."""
    checks = report["checks"]
    bad = [f"{n}: never ran" for n in names if n not in checks]
    bad += [f"{n}: {checks[n]['detail']}" for n in names if n in checks and not checks[n]["ok"]]
    assert not bad, "\n".join(bad)
