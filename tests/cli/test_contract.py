"""`kvevents hash | schema | golden | version`: text only, so run in-process through the real entry
point (one console-script subprocess checks the installed command itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import invoke as kve
from tests.helpers.cli import one_line_error as assert_user_error
from tests.helpers.cli import run
from tests.helpers.repo import GOLDEN_PATH, REPO, VLLM_GOLDEN_PATH

SCHEMA_PATH = REPO / "schemas" / "kvevent-batch.schema.json"


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN_PATH.read_text())


def test_hash_json_matches_golden_child_case(golden: dict) -> None:
    case = next(c for c in golden["cases"] if c["id"] == "C13_ps4_chain_child_namespaced")
    inp, ev = case["inputs"], case["events"]
    tokens = [str(t) for t in inp["parent_tokens"] + inp["tokens"]]
    proc = kve("hash", *tokens, "--page-size", "4", "--extra-key", "lora-a", "--cache-salt", "tenant-a", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"storage", "event", "event_int64"}
    assert out["storage"] == case["storage"]["parent_storage_hashes_hex"] + case["storage"]["storage_hashes_hex"]
    assert out["event"] == ev["parent_event_hashes_hex"] + ev["event_hashes_hex"]
    assert out["event_int64"][2:] == ev["published_block_hashes_int64"]


def test_hash_with_prior_and_commas(golden: dict) -> None:
    e = golden["direct"]["explicit_prior"]
    proc = kve(
        "hash", ",".join(map(str, e["tokens"])), "-p", "4", "--extra-key", "lora-a", "--prior", e["prior_hex"], "--json"
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["storage"] == out["event"] == e["get_storage_hash_str_with_prior"]


def test_hash_table(golden: dict) -> None:
    case = next(c for c in golden["cases"] if c["id"] == "C05_ps4_salt_only")
    tokens = [str(t) for t in case["inputs"]["tokens"]]
    proc = kve("hash", *tokens, "--page-size", "4", "--cache-salt", "tenant-a")
    assert proc.returncode == 0, proc.stderr
    for h in case["storage"]["storage_hashes_hex"] + case["events"]["event_hashes_hex"]:
        assert h in proc.stdout
    for v in case["events"]["published_block_hashes_int64"]:
        assert str(v) in proc.stdout
    assert case["events"]["event_chain_seed_hex"] in proc.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["hash", "1", "x", "-p", "2"], "'x'"),
        (["hash", "1", "4294967296", "-p", "2"], "position 1"),
        (["hash", "1", "-p", "2", "--prior", "zz"], "prior"),
        (["hash", "1", "-p", "0"], "page_size"),
        (["hash", "1"], "page-size"),
        (["golden", "--golden", "/nonexistent/golden.json"], "not found"),
        (["nosuchcommand"], "nosuchcommand"),
    ],
)
def test_user_errors_exit_2(args: list[str], needle: str) -> None:
    assert_user_error(kve(*args), 2, needle)


def test_schema_prints_the_committed_file() -> None:
    proc = kve("schema")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == SCHEMA_PATH.read_text()


def test_golden_passes() -> None:
    proc = kve("golden")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    assert "C13_ps4_chain_child_namespaced" in proc.stdout and "BlockStored_minimal" in proc.stdout
    assert "V01_cbor_plain" in proc.stdout  # schemas/golden/vllm-0.33.json is checked too
    assert "40 of 40 golden items pass" in proc.stdout


def test_golden_mismatch_exits_1(tmp_path: Path, golden: dict) -> None:
    bad = json.loads(json.dumps(golden))
    bad["cases"][0]["events"]["published_block_hashes_int64"][0] += 1
    bad["wire"]["AllBlocksCleared"]["msgpack_hex"] = "81a474797065b0416c6c426c6f636b73436c6561726565"
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(bad))
    proc = kve("golden", "--golden", str(path))
    assert_user_error(proc, 1, "2 of 35")
    assert proc.stdout.count("FAIL") == 2


def test_golden_directory_and_bad_json(tmp_path: Path) -> None:
    (tmp_path / "copy.json").write_text(GOLDEN_PATH.read_text())
    proc = kve("golden", "--golden", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "broken.json").write_text("{not json")
    assert_user_error(kve("golden", "--golden", str(tmp_path / "broken.json")), 2, "not valid JSON")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_user_error(kve("golden", "--golden", str(empty)), 2, "no golden")


def test_golden_runs_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert kve("golden").returncode == 0


@pytest.mark.subprocess
def test_version_from_the_installed_command() -> None:
    from kvevents import __version__

    proc = run("version", script=True)  # the console script (python -m kvevents where none is installed)
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == __version__
    assert proc.stdout.splitlines()[1].startswith("speedups: ")


def test_golden_with_nothing_to_check_fails(tmp_path: Path, golden: dict) -> None:
    empty = {k: type(v)() if k in ("cases", "namespace_seeds_storage", "direct", "scenarios", "wire") else v
             for k, v in golden.items()}  # fmt: skip
    f = tmp_path / "empty.json"
    f.write_text(json.dumps(empty))
    assert_user_error(kve("golden", "--golden", str(f)), code=1, needle="no golden items")


def test_golden_deeply_nested_json_is_a_user_error(tmp_path: Path) -> None:
    f = tmp_path / "deep.json"
    f.write_text("[" * 100_000)
    assert_user_error(kve("golden", "--golden", str(f)), code=2, needle="not valid JSON")


VLLM_GOLDEN = VLLM_GOLDEN_PATH


@pytest.mark.parametrize("name", ["V02_pickle_plain", "V04_cbor_salt_lora", "V05_cbor_seed0"])
def test_hash_vllm_profile_prints_vllms_values(name: str) -> None:
    case = next(c for c in json.loads(VLLM_GOLDEN.read_text())["cases"] if c["name"] == name)
    args = [
        "hash",
        *map(str, case["tokens"]),
        "-p",
        str(case["block_size"]),
        "--profile",
        f"vllm-{case['algo']}",
        "--json",
    ]
    if case["PYTHONHASHSEED"] is not None:
        args += ["--hash-seed", case["PYTHONHASHSEED"]]
    if name == "V04_cbor_salt_lora":
        args += ["--extra-key", "adapter-a", "--lora-path", "/adapters/a", "--cache-salt", "tenant-a"]
    proc = kve(*args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["none_hash"] == case["none_hash"] and out["digests"] == case["digests"]
    assert out["event_block_hashes"] == case["event_block_hashes"]
    if case["event_extra_keys"] is not None:
        assert out["extra_keys"] == case["event_extra_keys"]


def test_hash_unknown_profile_and_bad_prior_are_user_errors() -> None:
    assert_user_error(kve("hash", "1", "-p", "1", "--profile", "vllm-xxhash"), 2, "--profile")
    assert_user_error(kve("hash", "1", "-p", "1", "--profile", "vllm-sha256", "--prior", "abcd"), 2, "prior")


def test_golden_checks_the_vllm_file_too() -> None:
    proc = kve("golden", "--golden", str(VLLM_GOLDEN))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "V05_cbor_seed0" in proc.stdout and "5 of 5 golden items pass" in proc.stdout
