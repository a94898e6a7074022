"""Small lies and oddities (issue 29, item 6): what the help, the errors and the exit codes say.
In-process through the real entry point, except the Ctrl-C test (a `kvevents tail` subprocess)."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.main

from kvevents.cli import app
from kvevents.cli.output import LineFormatter
from kvevents.hashing import Namespace
from kvevents.recordlog import read_records
from tests.helpers.cli import argv, invoke, one_line_error
from tests.helpers.recordlog import PAGE, chain_events, write_log
from tests.helpers.repo import README


# ---------------------------------------------------------------- help text
@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["log", "inspect"], "kvevents log inspect [OPTIONS] FILE"),
        (["hash"], "kvevents hash [OPTIONS] TOKENS..."),
        (["tail"], "kvevents tail [OPTIONS] ENDPOINT"),
        (["keys", "generate"], "kvevents keys generate [OPTIONS] DIRECTORY"),
    ],
)
def test_placeholders_read_as_words(args: list[str], usage: str) -> None:
    r = invoke(*args, "--help")
    assert f"Usage: {usage}" in r.stdout and "{" not in r.stdout.split("\n\n", 2)[1], r.stdout


def test_a_missing_argument_is_named_as_in_the_usage_line() -> None:
    one_line_error(invoke("log", "inspect"), 2, "Missing argument 'FILE'")


def _commands(cmd: object, path: str = "") -> Iterator[tuple[str, object]]:
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}".strip())


def test_no_docstring_breaks_a_line_mid_sentence() -> None:
    """Every command's help is paragraphs: a single line break would print as one in --help."""
    for path, cmd in _commands(typer.main.get_command(app)):
        text = getattr(cmd, "help", None) or ""
        assert "\n" not in text.replace("\n\n", ""), (path, text)
    r = invoke("record", "--help", env={"COLUMNS": "200"})
    assert "a resync is written as a reset marker followed by the snapshot batches." in r.stdout


def test_repeatable_options_take_one_value_each() -> None:
    r = invoke("log", "inspect", "--help", env={"COLUMNS": "120"})
    salt = next(line for line in r.stdout.splitlines() if "--salt" in line)
    assert "TEXT..." not in salt and "TEXT" in salt and "(repeatable)" in salt


def test_export_jsonl_shows_no_default_it_cannot_leave(tmp_path: Path) -> None:
    r = invoke("log", "export", "--help")
    assert "[default: True]" not in r.stdout and "--jsonl" in r.stdout
    p = tmp_path / "l.kvlog"
    write_log(p, chain_events(Namespace(), n_chains=1))
    assert invoke("log", "export", str(p), "--jsonl").stdout == invoke("log", "export", str(p)).stdout


def test_top_level_help_groups_the_commands() -> None:
    out = invoke("--help").stdout
    panels = ["The main job", "Engine side: publish", "Consumer side: subscribe, check", "Record logs", "The contract"]
    where = [out.index(f"─ {p} ─") for p in panels]
    assert where == sorted(where), where
    main_job = out[where[0] : where[1]]
    assert "demo" in main_job and "route" in main_job and "hash" not in main_job
    assert "version" in out[where[4] :] and "serve" in out[where[1] : where[2]]


def test_the_readme_table_lists_every_command() -> None:
    table = README.read_text().split("## Command line", 1)[1].split("Exit codes:", 1)[0]
    listed = set(re.findall(r"`kvevents ([a-z]+)", table))
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert commands <= listed, commands - listed


# ---------------------------------------------------------------- usage errors that were silent
def test_demo_duration_and_requests_exclude_each_other() -> None:
    line = one_line_error(invoke("demo", "--requests", "100", "--duration", "5"), 2, "exclude each other")
    assert "--duration" in line and "--requests" in line


def test_serve_hash_algo_needs_the_vllm_engine() -> None:
    one_line_error(invoke("serve", "--hash-algo", "sha256_cbor"), 2, "add --engine vllm")
    one_line_error(invoke("serve", "--engine", "vllm", "--hash-algo", "md5"), 2, "--hash-algo must be sha256")


def test_golden_given_a_file_that_is_not_golden_is_a_usage_error(tmp_path: Path) -> None:
    f = tmp_path / "not-a-golden-file.json"
    f.write_text(json.dumps({"name": "something else", "version": 3}))
    r = invoke("golden", "--golden", str(f))
    one_line_error(r, 2, "is not a golden file")
    assert r.stdout == ""


def test_keys_generate_into_a_file_says_so_in_words(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    line = one_line_error(invoke("keys", "generate", str(f)), 2, "is not a directory")
    assert "Errno" not in line
    line = one_line_error(invoke("keys", "generate", str(f / "sub")), 2, "cannot write the keypair")
    assert "Errno" not in line and "Not a directory" in line


def test_nats_with_an_http_url_is_a_wrong_scheme(tmp_path: Path) -> None:
    r = invoke("fetch", "--nats", "http://127.0.0.1:4222", "--stream", "s", "-o", str(tmp_path / "f.kvlog"))
    line = one_line_error(r, 2, "http:// is not a NATS scheme")
    assert "nats://" in line and "Name or service" not in line


# ---------------------------------------------------------------- what the output claims
def test_hash_marks_a_partial_last_page() -> None:
    r = invoke("hash", "1", "2", "3", "--page-size", "4")
    assert r.returncode == 0
    assert "0..2 partial" in r.stdout and "page 0 is partial (3 of 4 tokens)" in r.stdout
    assert "never published" in r.stdout
    whole = invoke("hash", "1", "2", "3", "4", "--page-size", "4")
    assert "partial" not in whole.stdout


def _corrupt(tmp_path: Path) -> Path:
    p = tmp_path / "c.kvlog"
    write_log(p, chain_events(Namespace()))
    off = [r.offset for r in read_records(p)][3]
    data = bytearray(p.read_bytes())
    data[off + 40] ^= 0x80
    p.write_bytes(bytes(data))
    return p


def test_verify_strict_fails_on_a_skipped_region(tmp_path: Path) -> None:
    p = _corrupt(tmp_path)
    lenient = invoke("log", "inspect", str(p), "--verify", "--page-size", str(PAGE))
    assert lenient.returncode == 0 and "(exit 0; --strict makes it 1)" in lenient.stdout
    strict = invoke("log", "inspect", str(p), "--verify", "--page-size", str(PAGE), "--strict")
    assert strict.returncode == 1 and "exit 1 (--strict)" in strict.stdout
    assert strict.stderr.splitlines()[-1].startswith("kvevents: check failed: ")
    assert "1 corrupt region" in strict.stderr.splitlines()[-1] and "(--strict)" in strict.stderr
    clean = tmp_path / "ok.kvlog"
    write_log(clean, chain_events(Namespace()))
    assert invoke("log", "inspect", str(clean), "--verify", "--strict").returncode == 0


def test_library_warnings_use_the_cli_s_own_form() -> None:
    rec = logging.LogRecord("kvevents.zeromq", logging.WARNING, __file__, 1, "source %s\n stale", ("w0",), None)
    assert LineFormatter().format(rec) == "kvevents: warning: source w0 stale"


# ---------------------------------------------------------------- record
@pytest.fixture()
def refusing_endpoint() -> Iterator[str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield f"tcp://127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


def test_record_of_nothing_says_for_how_long_and_leaves_no_file(tmp_path: Path, refusing_endpoint: str) -> None:
    out = tmp_path / "none.kvlog"
    r = invoke("record", "--publisher", f"w0={refusing_endpoint}", "-o", str(out), "--duration", "0.5")
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines()[0] == f"recording 1 source(s) -> {out} for 0.5s (Ctrl-C stops)"
    assert not out.exists() and "no file left" in r.stdout
    again = invoke("record", "--publisher", f"w0={refusing_endpoint}", "-o", str(out), "--duration", "0.2")
    assert "exists" not in again.stderr  # the next run is not refused


def test_record_refuses_a_bare_endpoint_as_route_does(tmp_path: Path, refusing_endpoint: str) -> None:
    out = tmp_path / "r.kvlog"
    rec = invoke("record", "--publisher", refusing_endpoint, "-o", str(out), "--duration", "0.2")
    one_line_error(rec, 2, "expected NAME=ENDPOINT")
    route = invoke("route", "--publisher", refusing_endpoint, "--http", "127.0.0.1:0")
    one_line_error(route, 2, "expected NAME=ENDPOINT")


# ---------------------------------------------------------------- Ctrl-C
@pytest.mark.subprocess
def test_tail_interrupted_exits_130_after_its_summary(refusing_endpoint: str) -> None:
    proc = subprocess.Popen(argv("tail", refusing_endpoint), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("kvevents tail: connecting to")
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1].startswith("kvevents tail: interrupted after 0 batches") and "Traceback" not in err
