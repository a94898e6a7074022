"""`kvevents version` (and `kvevents --version`): the version, then which hashing/index path runs."""

from __future__ import annotations


def version() -> None:
    """Print the kvevents version, then which hashing/index path runs (compiled or pure Python)."""
    from kvevents import __version__, native

    print(__version__)
    print(native.describe())
