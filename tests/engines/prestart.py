"""The engine drivers of a session's selected engine tests, run ahead of those tests (pytest-xdist).

A driver imports a whole engine (about 10 s of CPU) and runs 10-20 s while its module's fixture
waits, and most other tests of the suite wait on sockets and timers, not the CPU. So under xdist
worker gw0 starts every selected driver at the end of collection (before any test is scheduled),
one after another on a thread, while both workers go on with other tests; each outcome goes to a
file beside the workers' temp dirs, and the module's fixture, on either worker, takes it from
there, waiting if it is not written yet. tests/conftest.py moves the engine modules to the end of
the run so their drivers have finished by then. Without xdist, or for a run not started ahead,
the fixture runs its driver itself (tests/engines/engine_tests.py).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

WAIT_S = 1800.0  # the longest a fixture waits for a run started ahead (each driver is bounded by 600 s)
LEADER = "gw0"

Outcome = dict[str, Any]  # {"report": ...}, {"skip": why} or {"fail": why}


class Run(Protocol):
    driver: str


_thread: threading.Thread | None = None
_running: list[subprocess.Popen[str]] = []
_stopping = threading.Event()


def shared_dir(config: pytest.Config) -> Path | None:
    """Where this xdist run keeps the outcomes: beside the workers' own temp dirs (xdist gives
    each worker <run dir>/popen-gwN as its basetemp); None without xdist."""
    basetemp = getattr(config.option, "basetemp", None)
    if getattr(config, "workerinput", None) is None or not basetemp:
        return None
    return Path(basetemp).parent / "engine-drivers"


def start(config: pytest.Config, runs: Sequence[Run], outcome: Callable[..., Outcome]) -> None:
    """On the leader worker: mark `runs` as started ahead, then run `outcome(run, tmp, started)`
    for each, one after another, on a thread, writing each outcome to its file."""
    global _thread
    root = shared_dir(config)
    if root is None or config.option.collectonly or not runs:
        return
    if config.workerinput.get("workerid") != LEADER:  # type: ignore[attr-defined]
        return
    root.mkdir(parents=True, exist_ok=True)
    for run in runs:
        (root / f"{run.driver}.queued").touch()

    def work() -> None:
        for run in runs:
            tmp = root / run.driver
            tmp.mkdir(exist_ok=True)
            try:
                if _stopping.is_set():
                    raise RuntimeError("the session was stopped first")
                result = outcome(run, tmp, _running.append)
            except BaseException as exc:  # noqa: BLE001 - the waiting fixture reports it
                result = {"fail": f"the {run.driver} driver started ahead failed: {exc!r}"}
            part = root / f"{run.driver}.part"
            part.write_text(json.dumps(result))
            part.replace(root / f"{run.driver}.json")

    _thread = threading.Thread(target=work, name="engine-drivers", daemon=True)
    _thread.start()


def take(config: pytest.Config, run: Run) -> Outcome | None:
    """The outcome of `run` if it was started ahead (waiting for it), else None."""
    root = shared_dir(config)
    if root is None or not (root / f"{run.driver}.queued").exists():
        return None
    done = root / f"{run.driver}.json"
    deadline = time.monotonic() + WAIT_S
    while not done.exists():
        if time.monotonic() > deadline:
            return {"fail": f"the {run.driver} driver started ahead wrote no outcome within {WAIT_S:g} s"}
        time.sleep(0.1)
    result: Outcome = json.loads(done.read_text())
    return result


def finish(interrupted: bool) -> None:
    """At the leader's session end: its drivers end first (the other worker may still wait for
    one); an interrupted session stops them instead."""
    if _thread is None:
        return
    if interrupted:
        _stopping.set()
        for proc in _running:
            if proc.poll() is None:
                proc.kill()
    _thread.join()
