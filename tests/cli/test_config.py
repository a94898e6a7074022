"""`--config FILE.toml` / `--print-config` on route, bridge, relay and serve: the flags' names as
keys, flags over the file over defaults, a command's own table, one line and exit 2 for an unknown
key, a bad value or a Python without a TOML reader."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.cli import invoke, one_line_error

ROUTE = ["route", "--publisher", "w0=tcp://127.0.0.1:5557,tcp://127.0.0.1:5559"]


def _settings(out: str) -> dict[str, str]:
    return dict(ln.split(" = ", 1) for ln in out.splitlines() if ln and not ln.startswith("#"))


@pytest.mark.parametrize(
    "argv",
    [
        ROUTE + ["--page-size", "32"],
        ["bridge", "--publisher", "w0=tcp://127.0.0.1:5557", "--stream", "kv", "--creds", "/etc/hostname"],
        ["relay", "--from", "e=tcp://127.0.0.1:5557,tcp://127.0.0.1:5558", "--endpoint", "tcp://127.0.0.1:6557"],
        ["serve", "--workers", "3", "--engine", "vllm"],
    ],
    ids=lambda a: a[0],
)
def test_print_config_reads_back_as_the_same_settings(argv: list[str], tmp_path: Path) -> None:
    first = invoke(*argv, "--print-config")
    assert first.returncode == 0 and first.stderr == "", first.stderr
    assert first.stdout.startswith(f"# kvevents {argv[0]}: the settings it runs with")
    (tmp_path / "c.toml").write_text(first.stdout)
    again = invoke(argv[0], "--config", str(tmp_path / "c.toml"), "--print-config")
    assert again.returncode == 0 and again.stdout == first.stdout


def test_flags_override_the_file_and_a_command_reads_only_its_own_table(tmp_path: Path) -> None:
    (tmp_path / "deploy.toml").write_text(
        '[route]\npublisher = ["w0=tcp://127.0.0.1:6000"]\npage-size = 8\nlora_strict = false\n'
        '[serve]\nworkers = 2\nendpoint = "tcp://127.0.0.1:6000"\n'
    )
    route = _settings(
        invoke("route", "--config", str(tmp_path / "deploy.toml"), "--page-size", "4", "--print-config").stdout
    )
    assert route["page-size"] == "4" and route["lora-strict"] == "false"
    assert route["publisher"] == '["w0=tcp://127.0.0.1:6000"]'
    serve = _settings(invoke("serve", "--config", str(tmp_path / "deploy.toml"), "--print-config").stdout)
    assert serve["workers"] == "2" and serve["endpoint"] == '"tcp://127.0.0.1:6000"'


def test_the_file_runs_the_command(tmp_path: Path) -> None:
    (tmp_path / "serve.toml").write_text(
        'endpoint = "tcp://127.0.0.1:*"\nreplay-endpoint = "tcp://127.0.0.1:*"\nworkers = 2\nduration = 0.3\n'
    )
    r = invoke("serve", "--config", str(tmp_path / "serve.toml"))
    assert r.returncode == 0, r.stderr
    assert [ln.split()[3] for ln in r.stdout.splitlines() if " worker " in ln] == ["w0", "w1"]


def test_unknown_keys_and_bad_values_are_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "typo.toml").write_text('pagesize = 8\npublisher = ["w0=tcp://127.0.0.1:1"]\ncolour = "red"\n')
    line = one_line_error(
        invoke("route", "--config", str(tmp_path / "typo.toml")), 2, "unknown key(s) pagesize, colour"
    )
    assert line.startswith(f"kvevents: error: --config {tmp_path / 'typo.toml'}:")
    (tmp_path / "bad.toml").write_text('page-size = "big"\n')
    one_line_error(
        invoke("route", "--config", str(tmp_path / "bad.toml")), 2, "page-size = 'big': Invalid value for '--page-size'"
    )
    (tmp_path / "broken.toml").write_text("page-size = \n")
    one_line_error(invoke("route", "--config", str(tmp_path / "broken.toml")), 2, "not valid TOML")
    one_line_error(invoke("relay", "--config", str(tmp_path / "none.toml")), 2, "none.toml: no such file")


def test_without_a_toml_reader_it_says_which_python_is_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c.toml").write_text("page-size = 8\n")
    monkeypatch.setitem(sys.modules, "tomllib", None)  # what Python 3.10 without tomli looks like
    monkeypatch.setitem(sys.modules, "tomli", None)
    one_line_error(invoke("route", "--config", str(tmp_path / "c.toml")), 2, "--config needs Python 3.11 or newer")


def test_print_config_never_prints_an_api_key() -> None:
    r = invoke(*ROUTE, "--api-key", "s3cret-key", "--read-only-key", "r3ad-key", "--print-config")
    assert r.returncode == 0, r.stderr
    assert "s3cret-key" not in r.stdout and "r3ad-key" not in r.stdout
    assert "# api-key = (set; not printed" in r.stdout and "# read-only-key = (set; not printed" in r.stdout
