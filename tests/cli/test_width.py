"""80 columns (issue 29, item 3): what a user sees in a terminal of 80 columns or through a pipe.

Tables too wide fall back to one record per row (nothing cut short with `…`), help text keeps its
placeholders whole, `serve --help` fits a screen or two. In-process at COLUMNS=80 (rich lays out
to COLUMNS when stdout is not a terminal, as when piped); one test runs `hash` on a real pty of
80 columns."""

from __future__ import annotations

import os
import pty
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvevents.hashing import Namespace, event_hashes, to_int64
from tests.helpers.cli import KVEVENTS, invoke
from tests.helpers.marks import require
from tests.helpers.recordlog import chain_events, write_log

COLS = {"COLUMNS": "80"}
TOKENS = [str(t) for t in range(1, 10)]  # 9 tokens at page size 4: two whole pages and a partial one


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def test_hash_at_80_columns_keeps_every_column_whole() -> None:
    r = invoke("hash", *TOKENS, "--page-size", "4", env=COLS)
    assert r.returncode == 0, r.stderr
    assert _widest(r.stdout) <= 80 and "…" not in r.stdout, r.stdout
    hashes = event_hashes([int(t) for t in TOKENS], 4, Namespace())
    for page, h in enumerate(hashes):
        assert f"page {page}  tokens {page * 4}.." in r.stdout
        assert f"event int64 {to_int64(h)}" in r.stdout and h in r.stdout


def test_hash_keeps_the_table_when_it_fits() -> None:
    r = invoke("hash", *TOKENS, "--page-size", "4", env={"COLUMNS": "220"})
    header = next(line for line in r.stdout.splitlines() if "storage hash" in line)
    assert "event int64" in header and "hex16" in header and "page" in header


def test_vllm_hash_at_80_columns() -> None:
    r = invoke("hash", *TOKENS, "-p", "4", "--profile", "vllm-sha256", "--cache-salt", "s", env=COLS)
    assert r.returncode == 0, r.stderr
    assert _widest(r.stdout) <= 80 and "…" not in r.stdout
    assert "block 1  tokens 4..7" in r.stdout and "event uint64 " in r.stdout and "extra_keys ['s']" in r.stdout


def _pty_run(args: list[str], cols: int) -> tuple[int, str]:
    """`kvevents ARGS` with stdout on a pty `cols` wide (the terminal rich asks for its size)."""
    import fcntl
    import termios

    require("subprocess")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(NO_COLOR="1", TERM="xterm")
    proc = subprocess.Popen([*KVEVENTS, *args], stdout=slave, stderr=slave, stdin=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        proc.wait(30)
    return proc.returncode, out.decode("utf-8", "replace").replace("\r\n", "\n")


@pytest.mark.subprocess
@pytest.mark.skipif(sys.platform != "linux", reason="a pty of a given size")
def test_hash_on_a_real_80_column_terminal() -> None:
    code, out = _pty_run(["hash", *TOKENS, "--page-size", "4"], 80)
    assert code == 0, out
    assert "…" not in out and _widest(out) <= 80, out
    assert "event int64" in out and "tokens 8..8 partial" in out


def test_log_inspect_by_source_at_80_columns(tmp_path: Path) -> None:
    p = tmp_path / "l.kvlog"
    write_log(p, chain_events(Namespace()))
    r = invoke("log", "inspect", str(p), env=COLS)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    body = r.stdout.split("by source", 1)[1].splitlines()
    assert body[1].startswith("source w0  endpoint tcp://127.0.0.1:5557")
    text = "\n".join(body)
    for head in ("records", "heartbeats", "gaps (missing)", "resets", "epochs 7"):
        assert head in text
    lines = [line for line in r.stdout.splitlines() if str(tmp_path) not in line]  # the path is as long as it is
    assert _widest("\n".join(lines)) <= 80


@pytest.mark.parametrize("command", ["route", "bridge", "record"])
def test_publisher_placeholder_is_whole_at_80_columns(command: str) -> None:
    r = invoke(command, "--help", env=COLS)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.split("--publisher", 1)[1].split("│ -", 1)[0]
    assert "…" not in rows and "NAME=ENDPOINT,REPLAY" in rows, rows


def test_serve_help_is_short_and_grouped() -> None:
    r = invoke("serve", "--help", env=COLS)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) <= 70 and _widest(r.stdout) <= 80, len(lines)
    for panel in ("Workers and workload", "Endpoints and wire", "CURVE", "Engine emulated", "Extras"):
        assert f"─ {panel} ─" in r.stdout
    assert "INTEGER [1..64]" in r.stdout  # a range as short as it reads


def test_help_defaults_stay_in_the_paragraph() -> None:
    """`[default: ...]` follows the help text, not a line of its own (typer's columns)."""
    r = invoke("serve", "--help", env=COLS)
    assert "Tokens per page. [default: 16]" in r.stdout


HELP_COMMANDS = [
    *("demo serve tail route record relay bridge fetch doctor hash golden schema version replay".split()),
    *("log inspect|log export|log repair|log index|keys generate|keys sign-key".split("|")),
    *("conformance hash|conformance stream|conformance drive|conformance render|conformance storage".split("|")),
]


def test_no_help_cell_is_cut_at_80_columns() -> None:
    cut = {}
    for command in HELP_COMMANDS:
        r = invoke(*command.split(), "--help", env=COLS)
        assert r.returncode == 0, (command, r.stderr)
        rows = [ln for ln in r.stdout.splitlines() if "…" in ln]
        if rows or _widest(r.stdout) > 80:
            cut[command] = rows[:2] or [f"{_widest(r.stdout)} columns"]
    assert not cut, cut
