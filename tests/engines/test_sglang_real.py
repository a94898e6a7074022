"""SGLang 0.5.20's own RadixCache, ZmqEventPublisher, decoder and plug-in loading against kvevents
(issue 25 parts 2 and 3).

Runs tests/engines/sglang_driver.py once in the SGLang venv (scripts/engine_env.sh sglang); ~20 s.
Stand-in: torchvision (tests/engines/standins.py, TORCHVISION): SGLang imports it at module level,
and the only wheels in reach are CUDA-linked and cannot load beside CPU torch; nothing on the
KV-cache or event paths calls it.

The engine-publisher tests need kvevents to accept SGLang 0.5.20's 3-frame replay replies
(issue 25 part 1): SGLang's own ROUTER answers `[seq, payload]` without a topic frame.
"""

from __future__ import annotations

import pytest

from tests.engines.engine_tests import DriverRun, assert_checks, run_driver
from tests.engines.standins import TORCHVISION

pytestmark = pytest.mark.engines
AHEAD = DriverRun("sglang", "sglang")

ENGINE_PUBLISHER = {
    "gap_index_equals_engine_cache_every_step",
    "late_index_equals_engine_cache_every_step",
    "gap_every_batch_once_in_order",
    "late_every_batch_once_in_order",
    "record_every_batch_once_in_order",
    "gap_repaired_by_replay",
    "gap_restart_detected",
    "late_restart_detected",
    "sglang_decoder_reads_kvevents_publisher",
    "relay_index_equals_engine_cache_every_step",
    "relay_republished_the_engine_restart",
    "relay_restart_seen_downstream",
    "relay_warm_start_read_the_engine_ring",
    "relay_restart_resynced_while_the_engine_is_idle",
}
PLUGIN = {
    "entry_point_declared",
    "sglang_factory_builds_kvevents",
    "plugin_live_index_equals_radix_tree_every_step",
    "plugin_late_index_equals_radix_tree_every_step",
    "plugin_live_every_batch_once_in_order",
    "plugin_late_every_batch_once_in_order",
    "plugin_gap_repaired_by_replay",
    "plugin_live_restart_detected",
    "plugin_late_restart_detected",
    "plugin_late_joiner_by_snapshot",
    "sglang_decoder_reads_plugin_replay",
    "plugin_describe_epoch",
    "plugin_heartbeats",
    "plugin_metrics",
    "plugin_honours_config_fields",
    "route_blocks_equal_radix_tree",
    "route_score_equals_engine_match",
    "plugin_dp_rank_port_offset",
    "plugin_batch_carries_attn_dp_rank",
    "plugin_publish_never_waits",
    "plugin_curve_keyed_consumer_equals_cache",
    "plugin_curve_plain_consumer_reads_nothing",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> dict:
    return run_driver(AHEAD, tmp_path_factory, pytestconfig)


def test_stand_ins_named(report: dict) -> None:
    assert report["standins"] == [TORCHVISION]


def test_every_check_asserted(report: dict) -> None:
    """A check the driver adds must be asserted here; a crashed scenario shows as its *_run check."""
    odd = set(report["checks"]) ^ (ENGINE_PUBLISHER | PLUGIN)
    assert not odd, {n: report["checks"].get(n, {"detail": "never ran"})["detail"] for n in sorted(odd)}


# ---- SGLang's own ZmqEventPublisher -> kvevents' Subscriber and `kvevents record`


def test_index_equals_radix_tree_after_every_step(report: dict) -> None:
    """300 requests (shared prefixes, 2 adapters as extra_key, a salt, eviction, flush, a restart):
    a gap-forced consumer's and a late joiner's BlockIndex equal the radix tree after every step."""
    assert_checks(report, "gap_index_equals_engine_cache_every_step", "late_index_equals_engine_cache_every_step")


def test_every_batch_once_in_order(report: dict) -> None:
    assert_checks(
        report, "gap_every_batch_once_in_order", "late_every_batch_once_in_order", "record_every_batch_once_in_order"
    )


def test_forced_gap_repaired_by_replay(report: dict) -> None:
    assert_checks(report, "gap_repaired_by_replay")


def test_publisher_restart_detected(report: dict) -> None:
    assert_checks(report, "gap_restart_detected", "late_restart_detected")


def test_sglang_decoder_reads_kvevents_publisher(report: dict) -> None:
    assert_checks(report, "sglang_decoder_reads_kvevents_publisher")


# ---- kvevents inside SGLang: the "kvevents" publisher plug-in


def test_plugin_loaded_by_sglang(report: dict) -> None:
    """The entry point (group sglang.srt.plugins), SGLang's load_plugins() and its factory."""
    assert_checks(report, "entry_point_declared", "sglang_factory_builds_kvevents")


def test_plugin_consumers_equal_radix_tree(report: dict) -> None:
    """SchedulerKvEventsPublisher builds our publisher; consumers (one with a forced gap, one joining
    late by snapshot) equal the radix tree after every step, across a restart (new epoch)."""
    assert_checks(
        report,
        "plugin_live_index_equals_radix_tree_every_step",
        "plugin_late_index_equals_radix_tree_every_step",
        "plugin_live_every_batch_once_in_order",
        "plugin_late_every_batch_once_in_order",
        "plugin_gap_repaired_by_replay",
        "plugin_live_restart_detected",
        "plugin_late_restart_detected",
        "plugin_late_joiner_by_snapshot",
    )


def test_route_fed_by_plugin_equals_cache(report: dict) -> None:
    """`kvevents route` (a subprocess): its block count and /score's matched pages equal the cache."""
    assert_checks(report, "route_blocks_equal_radix_tree", "route_score_equals_engine_match")


def test_plugin_wire_read_by_sglang(report: dict) -> None:
    """SGLang's own decoder reads the plug-in's replayed history; DESCRIBE carries the epoch."""
    assert_checks(report, "sglang_decoder_reads_plugin_replay", "plugin_describe_epoch")


def test_plugin_config_and_extras(report: dict) -> None:
    """Every KVEventsConfig field, the dp-rank port offset, heartbeats, metrics, a publish that never waits."""
    assert_checks(
        report,
        "plugin_honours_config_fields",
        "plugin_dp_rank_port_offset",
        "plugin_batch_carries_attn_dp_rank",
        "plugin_heartbeats",
        "plugin_metrics",
        "plugin_publish_never_waits",
    )


def test_plugin_curve_from_env(report: dict) -> None:
    assert_checks(report, "plugin_curve_keyed_consumer_equals_cache", "plugin_curve_plain_consumer_reads_nothing")


def test_relay_beside_the_engine(report: dict) -> None:
    """kvevents relay follows the engine's own publisher: its consumer equals the engine's cache after
    every step, across the engine's restart (republished as AllBlocksCleared) and the relay's own
    restart (a new epoch: the consumer resyncs by the relay's snapshot)."""
    assert_checks(
        report,
        "relay_index_equals_engine_cache_every_step",
        "relay_republished_the_engine_restart",
        "relay_restart_seen_downstream",
        "relay_warm_start_read_the_engine_ring",
        "relay_restart_resynced_while_the_engine_is_idle",
    )
