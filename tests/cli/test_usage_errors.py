"""A newcomer's first run (issue 15), the text-only part: one clear line for bad input (exit 2),
the golden table shows every name, the README's command rows name options the CLI has.
In-process through the real entry point: none of these needs a socket that accepts."""

from __future__ import annotations

import pytest

from kvevents.events import KVEventBatch, encode_batch
from kvevents.recordlog import RecordWriter
from kvevents.testing.zeromq import stored
from tests.helpers.cli import invoke, one_line_error
from tests.helpers.repo import README


@pytest.mark.parametrize(
    "args, words",
    [
        (["serve", "--metrics-port", "-1", "--duration", "1"], "--metrics-port must be in 0..65535"),
        (["serve", "--metrics-port", "70000", "--duration", "1"], "--metrics-port must be in 0..65535"),
        (["serve", "--endpoint", "tcp://nohost:1", "--duration", "1"], "host cannot be resolved"),
        (["tail", "tcp://127.0.0.1:5999", "--stale-after", "-1"], "--stale-after must be > 0"),
        (["tail", "tcp://127.0.0.1:5999", "--stale-after", "0"], "--stale-after must be > 0"),
        (["hash", "-1", "5", "-p", "2"], "token id -1 at position 0 is not an integer in 0..4294967295"),
        (["hash", "1", "2", "-7", "-p", "2"], "token id -7 at position 2"),
        (["hash", "1", "2", "--pagesize", "2", "-p", "2"], "no such option: --pagesize"),
        (["route", "--publisher", "w0=tcp://127.0.0.1:1", "--long-body-rate", "-1"], "--long-body-rate must be >= 0"),
    ],
)
def test_bad_input_is_one_clear_line_exit_2(args, words):
    err = one_line_error(invoke(*args), 2, words)
    assert "pydantic" not in err and "No such device" not in err


def test_replay_to_an_unresolvable_host_says_so(tmp_path):
    log = tmp_path / "one.kvlog"
    with RecordWriter(log) as w:
        w.write(encode_batch(KVEventBatch(1.0, [stored(1)], 0)), source="w", seq=0, epoch=1, recv_time=1.0)
    err = one_line_error(invoke("replay", str(log), "--to", "tcp://nohost:1"), 2)
    assert "'tcp://nohost:1'" in err and "host cannot be resolved" in err and "None" not in err


def test_golden_table_shows_null_namespace_names():
    r = invoke("golden")
    assert r.returncode == 0, r.stderr
    assert "[null, null]" in r.stdout and '[null, "tenant-a"]' in r.stdout


@pytest.mark.parametrize(
    "command, options",
    [
        (["serve"], ["--engine", "--hash-algo", "--metrics-port"]),
        (["route"], ["--key-mode"]),
        (["hash"], ["--profile"]),
        (["log", "inspect"], ["--profile"]),
        (["demo"], ["--fleet", "--requests", "--duration", "--seed"]),
        (["tail"], ["--count", "--duration"]),
    ],
)
def test_readme_command_rows_name_options_the_cli_has(command, options):
    readme = README.read_text(encoding="utf-8")
    row = next(ln for ln in readme.splitlines() if ln.startswith(f"| `kvevents {' '.join(command)} "))
    helptext = invoke(*command, "--help").stdout
    for opt in options:
        assert opt in row, (command, opt)
        assert opt in helptext, (command, opt)
