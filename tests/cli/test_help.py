"""The CLI's face: --version, and help text without type tags like <bool> (issue 15). Text only:
in-process through the real entry point."""

from __future__ import annotations

import kvevents
from tests.helpers.cli import invoke


def test_version_flag():
    r = invoke("--version")
    assert r.returncode == 0 and kvevents.__version__ in r.stdout and r.stderr == ""


def test_help_has_no_type_tags():
    for cmd in ("serve", "tail", "route", "record", "doctor", "hash"):
        r = invoke(cmd, "--help")
        assert r.returncode == 0, r.stderr
        assert "<" not in r.stdout.replace("<=", ""), (cmd, r.stdout)
    serve = invoke("serve", "--help").stdout
    assert "INTEGER" in serve and "TEXT" in serve
