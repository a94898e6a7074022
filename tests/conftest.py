"""Shared test set-up: a deterministic, bounded hypothesis profile, the golden vectors, a ZeroMQ
context and a loopback publisher with a replay endpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, settings

from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher

REPO = Path(__file__).resolve().parent.parent
GOLDEN_PATH = REPO / "schemas" / "golden" / "sglang-0.5.20.json"

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
