"""The markers a helper needs, checked against the test that calls it (set by tests/conftest.py).

A helper that starts an interpreter calls `require("subprocess")`: a test that forgot the marker
fails at once, so `pytest -m "not subprocess"` never starts one.
"""

from __future__ import annotations

from typing import Any

_current: list[Any] = []  # the running pytest item, at most one


def enter(item: Any) -> None:
    _current[:] = [item]


def leave() -> None:
    _current.clear()


def require(name: str) -> None:
    """Fail unless the running test (if any) carries marker `name`."""
    if _current and _current[0].get_closest_marker(name) is None:
        raise AssertionError(f"{_current[0].nodeid} needs @pytest.mark.{name} (a helper it calls needs it)")
