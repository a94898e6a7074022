"""Floods and walls (issue 29, item 4): a wrong page size does not print a line per event, and a
misspelled adapter is one usage error. In-process through the real entry point."""

from __future__ import annotations

from pathlib import Path

from kvevents.hashing import Namespace
from kvevents.recordlog import verify_log
from kvevents.recordlog.verify import KEPT_PER_CODE
from tests.helpers.cli import invoke, one_line_error
from tests.helpers.recordlog import PAGE, chain_events, write_log


def _big_log(path: Path, chains: int = 120) -> Path:
    write_log(path, chain_events(Namespace(), n_chains=chains))
    return path


def test_verify_at_the_wrong_page_size_prints_one_line_per_kind(tmp_path: Path) -> None:
    p = _big_log(tmp_path / "big.kvlog")
    r = invoke("log", "inspect", str(p), "--verify", "--page-size", str(PAGE * 2))
    assert r.returncode == 1
    violations = [x for x in r.stdout.splitlines() if x.startswith("violation")]
    assert len(violations) == 2, violations  # block-size and token-count, each once
    assert violations[0].startswith("violation block-size x240, the first at record 1 event 0 (w0 seq 1): ")
    assert "block_size 4 but --page-size is 8" in violations[0]
    assert len(r.stdout.splitlines()) < 30
    assert r.stdout.splitlines()[-1] == "verify: 480 violation(s): block-size 240, token-count 240"
    one_line_error(r, 1, "480 contract violation(s)")


def test_the_report_keeps_a_bounded_number_of_examples(tmp_path: Path) -> None:
    p = _big_log(tmp_path / "big.kvlog", chains=KEPT_PER_CODE + 20)
    rep = verify_log(p, PAGE * 2)
    assert rep.counts["block-size"] == 2 * (KEPT_PER_CODE + 20) and rep.violation_count == 4 * (KEPT_PER_CODE + 20)
    assert sum(1 for v in rep.violations if v.code == "block-size") == KEPT_PER_CODE
    assert not rep.ok and rep.as_dict()["violation_counts"]["token-count"] == 2 * (KEPT_PER_CODE + 20)


def test_verify_without_a_page_size_reads_the_events_block_size(tmp_path: Path) -> None:
    p = _big_log(tmp_path / "big.kvlog", chains=4)
    r = invoke("log", "inspect", str(p), "--verify")
    assert r.returncode == 0, r.stdout
    assert f"verify page size {PAGE} (the events' block_size)" in r.stdout and "verify: OK" in r.stdout
    rep = verify_log(p, None)
    assert rep.ok and rep.page_size == PAGE and not rep.page_size_given and rep.blocks_verified == 4 * 5


def test_a_misspelled_adapter_is_one_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "adapter.sh"
    r = invoke("conformance", "hash", "--cmd", f"sh {missing}", "--cases", "5")
    line = one_line_error(r, 2, "the adapter exited (code ")
    assert "before its first answer" in line and str(missing) in line and r.stdout == ""
