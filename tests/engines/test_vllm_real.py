"""vLLM 0.33.0's own KVCacheManager / BlockPool and ZmqEventPublisher against kvevents (issue 25).

Runs tests/engines/vllm_driver.py once in the vLLM venv (scripts/engine_env.sh vllm); ~14 s.
Stand-ins: none (every vLLM import on these paths runs on CPU).
"""

from __future__ import annotations

import pytest

from tests.engines.engine_tests import DriverRun, assert_checks, run_driver

pytestmark = pytest.mark.engines
AHEAD = DriverRun("vllm", "vllm", (("VLLM_TARGET_DEVICE", "cpu"),))

STANDINS: list[str] = []
ASSERTED = {
    "relay_index_equals_engine_cache_every_step",
    "relay_republished_the_engine_restart",
    "relay_restart_seen_downstream",
    "relay_warm_start_read_the_engine_ring",
    "relay_restart_resynced_while_the_engine_is_idle",
    "gap_index_equals_engine_cache_every_step",
    "late_index_equals_engine_cache_every_step",
    "gap_every_batch_once_in_order",
    "late_every_batch_once_in_order",
    "record_every_batch_once_in_order",
    "gap_repaired_by_replay",
    "gap_restart_detected",
    "late_restart_detected",
    "vllm_decoder_reads_kvevents_publisher",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> dict:
    return run_driver(AHEAD, tmp_path_factory, pytestconfig)


def test_stand_ins_named(report: dict) -> None:
    assert report["standins"] == STANDINS


def test_every_check_asserted(report: dict) -> None:
    """A check the driver adds must be asserted here (and none may fail outside a test)."""
    odd = set(report["checks"]) ^ ASSERTED
    assert not odd, {n: report["checks"].get(n, {"detail": "never ran"})["detail"] for n in sorted(odd)}


def test_index_equals_block_pool_after_every_step(report: dict) -> None:
    """300 requests (shared prefixes, 2 LoRA adapters, a salt, eviction, reset_prefix_cache, a restart):
    the kvevents BlockIndex of a gap-forced consumer and of a late joiner equals vLLM's BlockPool."""
    assert_checks(report, "gap_index_equals_engine_cache_every_step", "late_index_equals_engine_cache_every_step")


def test_every_batch_once_in_order(report: dict) -> None:
    assert_checks(
        report, "gap_every_batch_once_in_order", "late_every_batch_once_in_order", "record_every_batch_once_in_order"
    )


def test_forced_gap_repaired_by_replay(report: dict) -> None:
    assert_checks(report, "gap_repaired_by_replay")


def test_publisher_restart_detected(report: dict) -> None:
    """A new ZmqEventPublisher (seq from 0) over a fresh KVCacheManager: a Reset, then the new stream."""
    assert_checks(report, "gap_restart_detected", "late_restart_detected")


def test_vllm_decoder_reads_kvevents_publisher(report: dict) -> None:
    assert_checks(report, "vllm_decoder_reads_kvevents_publisher")


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
