"""`conformance hash --cmd` cannot be broken by its adapter (issue 28, part 4): a line without a
newline is capped (a clear failure naming the case, bounded memory), invalid UTF-8 is one bad
answer named by its case number, and the adapter's process group is killed when the kit ends.
Each adapter is a small script written by the test, run as a real process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from kvevents.conformance.hashkit import golden_cases, run_adapter
from kvevents.conformance.report import Status

REPO = Path(__file__).resolve().parents[2]
CASES = golden_cases()


def _readme_adapter() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"```python\n(# kvevents-conformance-adapter.*?)```", text, re.DOTALL)
    assert m, "the README's conformance adapter example is missing"
    return m.group(1)


def _cmd(tmp_path: Path, name: str, code: str) -> str:
    path = tmp_path / name
    path.write_text(code)
    return f"{sys.executable} {path}"


def _examples(report) -> list[str]:
    return [ex for rule in report.results for ex in rule.examples]


@pytest.mark.subprocess
def test_an_endless_line_is_capped_and_names_the_case(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "sys.stdin.readline()\n"
        "chunk = b'x' * (1 << 20)\n"
        "for _ in range(48):\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "sys.stdout.buffer.flush()\n"
        "time.sleep(60)\n"
    )
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        report = run_adapter(_cmd(tmp_path, "endless.py", code), CASES, timeout=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    first = CASES[0].id
    golden = report.result("hash-golden")
    assert golden.status is Status.FAIL
    assert (
        golden.examples[0] == f"{first}: answer line over 1048576 bytes (no newline within the limit): adapter stopped"
    )
    assert (
        golden.examples[1]
        == f"{CASES[1].id}: not run: adapter wrote an answer line over 1048576 bytes at case 1 ({first})"
    )
    assert peak < 8 << 20, f"the kit held {peak} bytes for a 48 MB line"
    assert time.monotonic() - t0 < 8  # the adapter was killed, not waited for


@pytest.mark.subprocess
def test_a_smaller_cap_applies_and_a_line_under_it_is_read(tmp_path: Path) -> None:
    report = run_adapter(_cmd(tmp_path, "a.py", _readme_adapter()), CASES, timeout=5, max_line=100)
    bad = [ex for ex in _examples(report) if "over 100 bytes" in ex]
    assert bad and report.result("hash-golden").status is Status.FAIL  # the 3-page answers are longer
    assert run_adapter(_cmd(tmp_path, "b.py", _readme_adapter()), CASES, timeout=5).ok


@pytest.mark.subprocess
def test_invalid_utf8_is_one_bad_answer_named_by_case_number(tmp_path: Path) -> None:
    code = _readme_adapter().replace(
        "    print(json.dumps(answer), flush=True)",
        "    if r['id'] == BAD:\n"
        '        sys.stdout.buffer.write(b\'{"id": "\\xff\\xfe"}\\n\'); sys.stdout.flush(); continue\n'
        "    print(json.dumps(answer), flush=True)",
    )
    code = f"BAD = {CASES[1].id!r}\n" + code
    report = run_adapter(_cmd(tmp_path, "utf8.py", code), CASES, timeout=5)
    examples = _examples(report)
    assert examples == [f"{CASES[1].id}: invalid UTF-8 at case 2 (byte 8 of the answer line)"]
    assert report.figures["failed"] == 1  # every other case was still read and checked


@pytest.mark.subprocess
def test_invalid_utf8_through_the_cli_is_no_traceback(tmp_path: Path) -> None:
    code = "import sys\nfor line in sys.stdin:\n    sys.stdout.buffer.write(b'\\xc3\\x28\\n'); sys.stdout.flush()\n"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvevents",
            "conformance",
            "hash",
            "--cmd",
            _cmd(tmp_path, "u.py", code),
            "--cases",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "invalid UTF-8 at case 1" in proc.stdout and "no answer" not in proc.stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.subprocess
def test_the_adapters_process_group_is_killed_when_the_kit_ends(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n" + _readme_adapter()
    )
    report = run_adapter(_cmd(tmp_path, "parent.py", code), CASES[:5], timeout=5)
    pid = int(pidfile.read_text())
    try:
        assert report.ok
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "a child of the adapter outlived the kit"
    finally:
        if _alive(pid):
            os.kill(pid, 9)
