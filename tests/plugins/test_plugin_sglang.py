"""kvevents' SGLang publisher plug-in without SGLang (kvevents/plugins/sglang.py): importable, declared,
and the config mapping and publish path over real loopback sockets. Inside SGLang itself it is tested
by tests/engines/test_sglang_real.py."""

from __future__ import annotations

import importlib.util
import logging
import sys
import time

import pytest

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvevents.plugins import PLUGINS
from kvevents.plugins import sglang as plug
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.subscriber import Delivery, Source, Subscriber
from tests.helpers.repo import REPO


def test_importable_without_sglang_and_register_needs_it() -> None:
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here: this checks the plug-in without it")
    assert "sglang" not in sys.modules  # importing the plug-in pulled nothing of SGLang in
    with pytest.raises(ImportError):
        plug.register()


def test_entry_point_declared_as_the_module_map_says() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    p = PLUGINS["sglang"]
    assert meta["project"]["entry-points"][p.group] == {p.name: p.entry}
    module, func = p.entry.split(":")
    assert module == p.module and callable(getattr(importlib.import_module(module), func))


def test_config_maps_every_sglang_field_and_the_rank_offsets() -> None:
    cfg = plug.publisher_config(
        2, "tcp://*:6100", "tcp://*:6200", buffer_steps=7, hwm=9, max_queue_size=11, topic="t", env={}
    )
    assert (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size, cfg.topic, cfg.dp_rank) == (7, 9, 11, "t", 2)
    assert (cfg.endpoint, cfg.replay_endpoint) == ("tcp://*:6100", "tcp://*:6200")  # the Publisher adds the rank
    ipc = plug.publisher_config(1, "ipc:///tmp/kve-plug", env={})
    assert ipc.endpoint == "ipc:///tmp/kve-plug_dp1"  # SGLang's own publisher refuses ipc for rank > 0
    env = {plug.ENV_METRICS_PORT: "9300", plug.ENV_HEARTBEAT_S: "0.25"}
    cfg = plug.publisher_config(3, "tcp://*:6100", env=env)
    assert cfg.metrics_port == 9303 and cfg.heartbeat_interval_s == 0.25


@pytest.mark.parametrize(
    ("kwargs", "env"),
    [
        ({"max_queue_size": 0}, {}),  # SGLang's "unbounded": refused, kvevents never queues without bound
        ({}, {plug.ENV_METRICS_PORT: "http"}),
        ({}, {plug.ENV_HEARTBEAT_S: "soon"}),
        ({}, {plug.ENV_CURVE_ALLOW: "/tmp"}),  # an allow-list without the server's certificate
        ({"endpoint": "tcp://*:99999"}, {}),
    ],
)
def test_bad_config_is_a_value_error(kwargs: dict, env: dict) -> None:
    with pytest.raises(ValueError):
        plug.publisher_config(0, **{"endpoint": "tcp://*:6100", **kwargs}, env=env)


def test_convert_keeps_kvevents_events_and_counts_foreign_ones() -> None:
    evs = [BlockStored([1], None, [1, 2], 2, None, "GPU", None), BlockRemoved([1], "GPU"), AllBlocksCleared(), object()]
    out, unknown = plug.convert_events(evs)
    assert out == evs[:3] and unknown == 1


def test_publishes_with_its_rank_and_never_waits(caplog: pytest.LogCaptureFixture) -> None:
    """A batch handed to publish() reaches a kvevents Subscriber with the rank SGLang gave the publisher;
    an unknown (newer SGLang) config field is said once and ignored."""
    with caplog.at_level(logging.WARNING, "kvevents.plugins.sglang"):
        pub = plug.SGLangPublisher(attn_dp_rank=1, endpoint=EPH, replay_endpoint=EPH, topic="kv", newer_field=1)
    assert "newer_field" in caplog.text
    sub = Subscriber([Source(pub.endpoint, pub.replay_endpoint, name="sg")])
    try:
        got: list[Delivery] = []
        ev = BlockStored([5, 6], None, list(range(4)), 2, None, "GPU", None, cache_salt="s")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            pub.publish(KVEventBatch(time.time(), [ev]))
            got += [d for d in sub.poll(0.2) if isinstance(d, Delivery) and d.batch.events]
        assert got and got[0].batch.data_parallel_rank == 1 and got[0].batch.events == [ev] and got[0].topic == "kv"
    finally:
        sub.stop()
        pub.shutdown()
    with pytest.raises(RuntimeError):
        pub.publish(KVEventBatch(time.time(), []))
