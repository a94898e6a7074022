"""The CLI's face: --version, and help text without type tags like <bool> (issue 15)."""

from __future__ import annotations

import os
import subprocess
import sys

import kvevents


def _kv(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kvevents", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_version_flag():
    r = _kv("--version")
    assert r.returncode == 0 and kvevents.__version__ in r.stdout and r.stderr == ""


def test_help_has_no_type_tags():
    for cmd in ("serve", "tail", "route", "record", "doctor", "hash"):
        r = _kv(cmd, "--help")
        assert r.returncode == 0, r.stderr
        assert "<" not in r.stdout.replace("<=", ""), (cmd, r.stdout)
    serve = _kv("serve", "--help").stdout
    assert "INTEGER" in serve and "TEXT" in serve
