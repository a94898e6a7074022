"""tests/helpers/ahead.py: one worker leads whatever its name, and a dead leader fails its waiters at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.helpers import ahead


class _Run:
    """A set-up that counts its runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def outcome(self, tmp: Path, started=None) -> dict:
        self.calls += 1
        return {"report": {"ran": self.name}}


def _worker(run_dir: Path, worker: str) -> SimpleNamespace:
    """A config as an xdist worker sees it: its basetemp is <run dir>/popen-<worker>."""
    option = SimpleNamespace(basetemp=str(run_dir / f"popen-{worker}"), collectonly=False)
    return SimpleNamespace(option=option, workerinput={"workerid": worker})


def test_the_first_worker_to_claim_leads_and_the_other_takes_its_outcome(tmp_path: Path) -> None:
    run = _Run("slow")
    first, second = _worker(tmp_path, "gw7"), _worker(tmp_path, "gw3")  # neither is gw0
    ahead.start(first, [run])
    ahead.start(second, [run])
    ahead.finish(interrupted=False)
    assert run.calls == 1
    assert ahead.take(second, run) == {"report": {"ran": "slow"}}
    assert ahead.take(first, run) == {"report": {"ran": "slow"}}


def test_a_leader_gone_before_its_outcome_fails_the_waiter_at_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ahead, "WAIT_S", 2.0)  # without the liveness check: a timeout, not this failure
    config = _worker(tmp_path, "gw1")
    root = ahead.shared_dir(config)
    assert root is not None
    root.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (root / ahead.LEADER_FILE).write_text(gone.stdout.strip())
    (root / "slow.queued").touch()
    outcome = ahead.take(config, _Run("slow"))
    assert outcome is not None and "exited before writing its outcome" in outcome["fail"]


def test_without_xdist_nothing_runs_ahead(tmp_path: Path) -> None:
    run = _Run("slow")
    config = SimpleNamespace(option=SimpleNamespace(basetemp=str(tmp_path), collectonly=False))
    ahead.start(config, [run])
    assert run.calls == 0 and ahead.take(config, run) is None
