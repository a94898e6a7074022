"""`kvevents conformance storage` where SGLang is not installed: one line, exit 2 (through the real
entry point, in process).
Inside SGLang it is run by tests/engines/test_sglang_hicache.py (hicache_driver.py's cli_* checks)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers.cli import CliResult, invoke


def _run(*args: str) -> CliResult:
    return invoke("conformance", "storage", *args, timeout=60)


def test_without_sglang_it_says_so_in_one_line() -> None:
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here")
    p = _run(
        "--module", "kvevents.plugins.hicache", "--class", "KVEventsHiCacheStorage", "--config", '{"path": "/tmp/x"}'
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and p.stdout == "" and len(lines) == 1
    assert "SGLang is needed" in lines[0] and "Traceback" not in p.stderr


@pytest.mark.parametrize("config", ["{not json", "[1, 2]"])
def test_bad_config_is_a_usage_error(config: str) -> None:
    p = _run("--module", "m", "--class", "C", "--config", config)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--config" in p.stderr
