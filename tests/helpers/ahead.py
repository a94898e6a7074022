"""Slow module set-ups run ahead of their tests under pytest-xdist: the engine drivers
(tests/engines/engine_tests.py: each imports a whole engine, ~10 s of CPU, and runs 10-20 s) and
the wheel's venv (tests/packaging/test_wheel.py).

Most tests of the suite wait on sockets and timers, not the CPU, while such a set-up holds its
worker for its whole length. A module names its set-up `AHEAD` (an object with `name` and
`outcome(tmp, started)`); under xdist the first worker to claim the run's leader file (whichever
worker, by an exclusive create) starts every selected module's set-up at the end of collection
(before any test is scheduled), one after another on a thread, while both workers go on with
other tests. Each outcome ({"report": ...}, {"skip": why} or {"fail": why}) goes to a file beside
the workers' temp dirs, and the module's fixture, on either worker, takes it from there, waiting if
it is not written yet (failing at once if the leader's process is gone); tests/conftest.py moves
those modules to the end of the run so their set-ups have finished by then. Without xdist the fixture runs the set-up itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

WAIT_S = 1800.0  # the longest a fixture waits for a set-up started ahead (each is bounded by 600 s)
LEADER_FILE = "leader"  # holds the pid of the worker running the set-ups

Outcome = dict[str, Any]  # {"report": ...}, {"skip": why} or {"fail": why}


class Ahead(Protocol):
    """A module's slow set-up: `outcome` runs it in `tmp` (`started` is given each process it
    starts, so an interrupted session can stop it)."""

    @property
    def name(self) -> str: ...

    def outcome(self, tmp: Path, started: Callable[[subprocess.Popen[str]], None] | None = None) -> Outcome: ...


def of(item: pytest.Item) -> Ahead | None:
    """The set-up the item's module runs ahead, if it names one (`AHEAD`)."""
    run = getattr(getattr(item, "module", None), "AHEAD", None)
    return run if run is not None and hasattr(run, "outcome") else None


_threads: list[threading.Thread] = []
_running: list[subprocess.Popen[str]] = []
_stopping = threading.Event()


def shared_dir(config: pytest.Config) -> Path | None:
    """Where this xdist run keeps the outcomes: beside the workers' own temp dirs (xdist gives
    each worker <run dir>/popen-gwN as its basetemp); None without xdist."""
    basetemp = getattr(config.option, "basetemp", None)
    if getattr(config, "workerinput", None) is None or not basetemp:
        return None
    return Path(basetemp).parent / "ahead"


def start(config: pytest.Config, runs: Sequence[Ahead]) -> None:
    """On the worker that claims the leader file first: mark `runs` as started ahead, then run each
    one's outcome, one after another, on a thread, writing each to its file."""
    root = shared_dir(config)
    if root is None or config.option.collectonly or not runs:
        return
    root.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(root / LEADER_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # another worker leads
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    for run in runs:
        (root / f"{run.name}.queued").touch()

    def work() -> None:
        for run in runs:
            tmp = root / run.name
            tmp.mkdir(exist_ok=True)
            try:
                if _stopping.is_set():
                    raise RuntimeError("the session was stopped first")
                result = run.outcome(tmp, _running.append)
            except BaseException as exc:  # noqa: BLE001 - the waiting fixture reports it
                result = {"fail": f"the {run.name} set-up started ahead failed: {exc!r}"}
            part = root / f"{run.name}.part"
            part.write_text(json.dumps(result))
            part.replace(root / f"{run.name}.json")

    thread = threading.Thread(target=work, name="set-ups-ahead", daemon=True)
    _threads.append(thread)
    thread.start()


def take(config: pytest.Config, run: Ahead) -> Outcome | None:
    """The outcome of `run` if it was started ahead (waiting for it), else None."""
    root = shared_dir(config)
    if root is None or not (root / f"{run.name}.queued").exists():
        return None
    done = root / f"{run.name}.json"
    deadline = time.monotonic() + WAIT_S
    while not done.exists():
        if not _leader_alive(root) and not done.exists():
            return {"fail": f"the worker running the {run.name} set-up ahead exited before writing its outcome"}
        if time.monotonic() > deadline:
            return {"fail": f"the {run.name} set-up started ahead wrote no outcome within {WAIT_S:g} s"}
        time.sleep(0.1)
    result: Outcome = json.loads(done.read_text())
    return result


def _leader_alive(root: Path) -> bool:
    """Whether the process named in the leader file still runs (True while it is being written)."""
    try:
        pid = int((root / LEADER_FILE).read_text())
    except (OSError, ValueError):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def result(outcome: Outcome) -> Any:
    """The report of an outcome; a skip or a failure of the set-up becomes the test's."""
    if "skip" in outcome:
        pytest.skip(outcome["skip"])
    if "fail" in outcome:
        pytest.fail(outcome["fail"])
    return outcome["report"]


def finish(interrupted: bool) -> None:
    """At the leader's session end: its set-ups end first (the other worker may still wait for
    one); an interrupted session stops them instead."""
    if not _threads:
        return
    if interrupted:
        _stopping.set()
        for proc in _running:
            if proc.poll() is None:
                proc.kill()
    for thread in _threads:
        thread.join()
