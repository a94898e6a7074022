"""PublisherConfig defaults (the contract, "Transport in one page"): the project's default binds loopback; explicit
endpoints with `bind` unset follow the vLLM rule."""

from __future__ import annotations

import pytest
import zmq

from kvevents.zeromq.publisher import Publisher, PublisherConfig
from kvevents.zeromq.wire import should_bind


def test_default_endpoint_is_bound_loopback() -> None:
    cfg = PublisherConfig()
    assert cfg.endpoint == "tcp://127.0.0.1:5557" and cfg.bind is True
    assert (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size, cfg.topic) == (10000, 100000, 100000, "")
    assert cfg.heartbeat_interval_s == 1.0 and cfg.replay_endpoint is None and cfg.dp_rank == 0


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        ("tcp://127.0.0.1:6001", False),
        ("tcp://*:6001", True),
        ("tcp://0.0.0.0:6001", True),
        ("tcp://[::]:6001", True),
        ("ipc:///tmp/kve-test", True),
        ("inproc://kve-test", True),
    ],
)
def test_explicit_endpoint_follows_the_vllm_rule(endpoint: str, binds: bool) -> None:
    cfg = PublisherConfig(endpoint=endpoint)
    assert cfg.bind is None
    assert should_bind(cfg.endpoint, cfg.bind) is binds


def test_explicit_bind_wins() -> None:
    assert PublisherConfig(bind=False).bind is False
    assert PublisherConfig(endpoint="tcp://127.0.0.1:6001", bind=True).bind is True


def test_override_of_a_default_config_drops_the_default_bind() -> None:
    """Publisher(PublisherConfig(), endpoint=E) connects to E like PublisherConfig(endpoint=E) does."""
    ctx = zmq.Context()
    try:
        sink = ctx.socket(zmq.SUB)
        port = sink.bind_to_random_port("tcp://127.0.0.1")
        pub = Publisher(PublisherConfig(), endpoint=f"tcp://127.0.0.1:{port}", heartbeat_interval_s=0)
        try:
            assert pub.endpoint == f"tcp://127.0.0.1:{port}"  # connected to the consumer that binds
        finally:
            pub.close(timeout=0.5)
        sink.close(linger=0)
    finally:
        ctx.term()
