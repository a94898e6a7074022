"""`conformance hash`: the README's adapter passes every case; a wrong, silent, crashing or
garbling adapter fails clearly (named case, first differing page, never a traceback)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from kvevents.conformance.hashkit import (
    all_cases,
    check_answer,
    golden_cases,
    property_cases,
    run_adapter,
)
from kvevents.conformance.report import Status
from tests.helpers.cli import invoke as kve
from tests.helpers.cli import one_line_error as assert_user_error
from tests.helpers.marks import require
from tests.helpers.repo import README

CASES = golden_cases() + property_cases(seed=3, n=30)


def readme_adapter() -> str:
    text = README.read_text()
    m = re.search(r"```python\n(# kvevents-conformance-adapter.*?)```", text, re.DOTALL)
    assert m, "the README's conformance adapter example is missing"
    return m.group(1)


def write(tmp_path: Path, name: str, code: str) -> str:
    """An adapter script and the command that runs it (an interpreter per run: a subprocess test)."""
    require("subprocess")
    path = tmp_path / name
    path.write_text(code)
    return f"{sys.executable} {path}"


@pytest.mark.subprocess
def test_readme_adapter_passes_every_case(tmp_path: Path) -> None:
    report = run_adapter(write(tmp_path, "adapter.py", readme_adapter()), CASES, timeout=5)
    assert report.ok, report.table()
    assert {r.rule for r in report.results} == {
        "hash-golden",
        "hash-direct",
        "hash-reject",
        "hash-property",
        "hash-chunked",
    }
    assert report.figures["cases"] == len(CASES)


@pytest.mark.subprocess
def test_adapter_mixing_extra_key_into_the_event_chain_fails(tmp_path: Path) -> None:
    """The storage seed (extra_key + salt) used for the published chain: golden C04/C06 must catch it."""
    mixed = (
        readme_adapter()
        .replace(
            'hashlib.sha256(b"sglang-cache-salt-v1\\0" + salt.encode()).digest() if salt else b""',
            'storage_seed(r["extra_key"], salt)',
        )
        .replace(
            "for line in sys.stdin:",
            """def field(v):
    return b"\\0" if v is None else b"\\1" + struct.pack("<Q", len(v.encode())) + v.encode()

def storage_seed(ek, salt):
    salt = salt or None
    return b"" if ek is None and salt is None else hashlib.sha256(b"sglang-cache-namespace-v1" + field(ek) + field(salt)).digest()

for line in sys.stdin:""",
        )
    )
    assert "storage_seed(r" in mixed
    report = run_adapter(write(tmp_path, "mixed.py", mixed), CASES, timeout=5)
    assert not report.ok
    golden = report.result("hash-golden")
    assert golden.status is Status.FAIL
    assert any(ex.startswith("C04_ps4_lora_only: page 0: got ") for ex in golden.examples), golden.examples
    assert report.result("hash-property").status is Status.FAIL


@pytest.mark.subprocess
def test_crashing_adapter_is_a_clear_failure(tmp_path: Path) -> None:
    code = readme_adapter().replace(
        "for line in sys.stdin:",
        "for n, line in enumerate(sys.stdin):\n    if n == 3:\n        sys.exit('engine blew up')",
    )
    report = run_adapter(write(tmp_path, "crash.py", code), CASES, timeout=5)
    golden = report.result("hash-golden")
    assert golden.status is Status.FAIL
    assert "adapter exited (code 1)" in golden.examples[0] and "engine blew up" in golden.examples[0]
    assert golden.checked == sum(1 for c in CASES if c.group == "golden")  # the rest reported as not run


def test_garbled_and_wrong_answers_are_named() -> None:
    case = golden_cases()[1]  # C02: 3 pages
    assert check_answer(case, {"id": case.id, "hashes": case.expected[:2]}) == "2 hashes for 3 pages"
    bad = list(case.expected)
    bad[1] = "0" * 64
    assert check_answer(case, {"id": case.id, "hashes": bad}).startswith("page 1: got 0000")
    ints = [int.from_bytes(bytes.fromhex(h[:16]), "big", signed=True) for h in case.expected]
    assert check_answer(case, {"id": case.id, "hashes": ints}) is None  # the published int64 form is fine
    reject = next(c for c in golden_cases() if c.group == "reject")
    assert "must be refused" in check_answer(reject, {"id": reject.id, "hashes": []})


def test_cases_are_deterministic_and_cover_the_golden_file(golden: dict) -> None:
    assert [c.id for c in all_cases(seed=5, n=10)] == [c.id for c in all_cases(seed=5, n=10)]
    ids = {c.id.split("/")[0] for c in golden_cases()}
    assert {c["id"] for c in golden["cases"]} <= ids
    assert any(c.group == "chunked" for c in property_cases(seed=5, n=10))


@pytest.mark.subprocess
def test_cli_exit_codes(tmp_path: Path) -> None:
    good = kve("conformance", "hash", "--cmd", write(tmp_path, "a.py", readme_adapter()), "--cases", "10", "--json")
    assert good.returncode == 0, good.stderr
    assert '"ok": true' in good.stdout
    bad = kve("conformance", "hash", "--cmd", write(tmp_path, "b.py", "import sys\nsys.exit(3)\n"), "--cases", "5")
    assert_user_error(bad, 2, "adapter exited (code 3) before its first answer")  # nothing checked: input error
    assert_user_error(kve("conformance", "hash", "--cmd", "no-such-adapter-binary"), 2, "cannot be started")


@pytest.mark.parametrize(
    "args",
    [
        ["conformance", "stream", "nonsense://x", "--page-size", "4"],
        ["conformance", "stream", "tcp://127.0.0.1:1", "--page-size", "4", "--profile", "nope"],
        ["conformance", "drive", "--http", "ftp://x", "--endpoint", "tcp://127.0.0.1:1", "--page-size", "4"],
    ],
)
def test_cli_usage_errors(args: list[str]) -> None:
    proc = kve(*args)
    assert_user_error(proc, 2)


@pytest.mark.subprocess
def test_unresponsive_adapter_is_given_up_after_a_few_cases(tmp_path: Path) -> None:
    code = "import sys, time\nfor line in sys.stdin:\n    time.sleep(30)\n"
    report = run_adapter(write(tmp_path, "silent.py", code), CASES, timeout=0.1)
    assert report.figures["seconds"] < 5
    assert report.result("hash-golden").examples[0].endswith("no answer within 0.1 s")
    assert any(
        "not run: adapter gave no answer to 3 cases in a row" in ex for ex in report.result("hash-property").examples
    )


VLLM_ADAPTER = """
import json, sys
from kvevents.engines.vllm import vllm_block_hashes
from kvevents.conformance.hashkit_vllm import tagged_from_json
for line in sys.stdin:
    r = json.loads(line)
    keys = tagged_from_json(r["hash_extra_keys"]) if USE_KEYS else None
    ds = vllm_block_hashes(r["token_ids"], r["page_size"], hash_algo=r["hash_algo"], seed=r["seed"],
                           parent=bytes.fromhex(r["prior"]) if r["prior"] else None, extra_keys_per_block=keys)
    print(json.dumps({"id": r["id"], "hashes": [d.hex() for d in ds] if HEX else [int(d[-8:].hex(), 16) for d in ds]}),
          flush=True)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_vllm_profile_cases(tmp_path: Path, algo: str) -> None:
    from kvevents.conformance.hashkit_vllm import vllm_cases

    cases = vllm_cases(algo, seed=4, n=20)
    assert any(c.group == "golden" for c in cases) and any(c.group == "chunked" for c in cases)
    good = write(tmp_path, "v.py", "USE_KEYS, HEX = True, False\n" + VLLM_ADAPTER)  # the published uint64 form
    report = run_adapter(good, cases, timeout=5)
    assert report.ok, report.table()
    blind = write(tmp_path, "b.py", "USE_KEYS, HEX = False, True\n" + VLLM_ADAPTER)  # ignores LoRA and salt keys
    report = run_adapter(blind, cases, timeout=5)
    assert "hash-property" in report.failed()
    if algo == "sha256_cbor":
        assert any(ex.startswith("V03_cbor_lora: page 0") for ex in report.result("hash-golden").examples)
