"""SGLang 0.5.20's HiCache storage tier over kvevents' backend (issue 25 part 5): the seed's end-to-end
test on CPU, damaged page files, metrics, and `kvevents conformance storage`.

Runs tests/engines/hicache_driver.py once in the SGLang venv (scripts/engine_env.sh sglang); ~18 s.
SGLang's own HiRadixCache and HiCacheController move every page device -> host -> storage -> (evicted)
-> prefetch -> host -> device; its `dynamic` factory builds kvevents.plugins.hicache.
Stand-ins (tests/engines/standins.py), each needed only because this machine has no CUDA:
- TORCHVISION: SGLang imports it at module level; the only wheels in reach are CUDA-linked;
- HICACHE_HOST_REGISTER: the host KV pool's cudaHostRegister (`ALLOC_MEMORY_FUNCS["cpu"]`);
- HICACHE_TRANSFER: the device<->host page copy `pool_host.mha.transfer_kv_direct` (from sgl_kernel);
- HICACHE_PIN_MEMORY: `pin_memory` of the host pool (pinned tensors need a CUDA device).
"""

from __future__ import annotations

import pytest

from tests.engines.engine_tests import DriverRun, assert_checks, run_driver
from tests.engines.standins import HICACHE, TORCHVISION

pytestmark = pytest.mark.engines
AHEAD = DriverRun("sglang", "hicache")

RULES = (
    "scenario_completes",
    "backend_loaded",
    "pages_under_storage_keys",
    "flush_leaves_only_storage",
    "first_request_computes",
    "other_namespaces_miss",
    "second_request_hits_storage",
    "contents_round_trip",
    "index_equals_cache",
    "router_credits_servable_only",
)
SEED = {f"seed_{r}" for r in RULES}
OTHER_BACKENDS = {
    "interface_v1_conformance",
    "sglang_hicache_file_conformance",
    "conformance_fails_a_backend_that_forgets",
}
DAMAGE = {
    "corrupt_page_is_a_counted_miss",
    "corrupt_page_never_served",
    "write_through_repairs_corrupt_page",
    "swapped_pages_are_misses",
    "swapped_pages_rewritten",
    "metrics_scrape_equals_stats",
    "metrics_server_stops_on_detach",
}
CLI = {
    "cli_passes_kvevents_backend",
    "cli_fails_a_namespace_blind_backend",
    "cli_without_cpu_standins_exits_2_one_line",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> dict:
    return run_driver(AHEAD, tmp_path_factory, pytestconfig)


def test_stand_ins_named(report: dict) -> None:
    assert report["standins"] == [TORCHVISION, *HICACHE]


def test_every_check_asserted(report: dict) -> None:
    """A check the driver adds must be asserted here; a crashed part shows as its *_run check."""
    odd = set(report["checks"]) ^ (SEED | OTHER_BACKENDS | DAMAGE | CLI)
    assert not odd, {n: report["checks"].get(n, {"detail": "never ran"})["detail"] for n in sorted(odd)}


def test_sglang_loads_the_backend_and_writes_through_to_it(report: dict) -> None:
    """Built by SGLang's dynamic factory as cls(storage_config, kwargs); every page of a first
    request reaches it under the contract's storage key; flushes leave pages only in storage."""
    assert_checks(
        report, "seed_scenario_completes", "seed_backend_loaded", "seed_pages_under_storage_keys",
        "seed_flush_leaves_only_storage", "seed_first_request_computes",
    )  # fmt: skip


def test_adapter_pages_come_back_from_storage_identical(report: dict) -> None:
    assert_checks(report, "seed_second_request_hits_storage", "seed_contents_round_trip")


def test_base_and_salted_find_less_than_a_page_of_the_adapters(report: dict) -> None:
    assert_checks(report, "seed_other_namespaces_miss")


def test_router_fed_by_the_cache_never_credits_another_namespace(report: dict) -> None:
    """BlockIndex equals the cache's device and host tiers after every step; at every arrival the
    router credits no page the cache cannot serve for that namespace, and after it every one."""
    assert_checks(report, "seed_index_equals_cache", "seed_router_credits_servable_only")


def test_v1_interface_and_sglangs_own_file_backend(report: dict) -> None:
    """The same scenario over `"interface_v1": 1` (host-pool page IO) and over SGLang's HiCacheFile;
    a backend that forgets its writes fails it."""
    assert_checks(report, *sorted(OTHER_BACKENDS))


def test_damaged_page_files(report: dict) -> None:
    """A flipped byte stops the prefetch at that page (SGLang recomputes, write-through repairs);
    swapped files are misses; the metrics endpoint equals stats() and stops on detach."""
    assert_checks(report, *sorted(DAMAGE))


def test_conformance_storage_cli(report: dict) -> None:
    """`kvevents conformance storage` passes kvevents' backend, fails a namespace-blind one, and
    without the CPU stand-ins says in one line (exit 2) that SGLang's cache cannot be built."""
    assert_checks(report, *sorted(CLI))
