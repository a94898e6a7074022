"""Build the optional C fast path (kvevents.native._speedups) when a C compiler is present.

Everything else is configured in pyproject.toml. Without a compiler (or when the build fails),
installation goes on and prints one line: kvevents then runs its pure-Python paths, which give
identical results (kvevents/native/__init__.py picks the path; `kvevents doctor` reports it).
Set KVEVENTS_NO_EXT=1 to skip the extension, KVEVENTS_SANITIZE=1 to build it with
-fsanitize=address,undefined (scripts/asan_check.sh).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_FLAGS = ["-O3", "-std=c99", "-fno-strict-aliasing"]
if os.environ.get("KVEVENTS_SANITIZE") == "1":
    _FLAGS = [
        "-O1",
        "-g",
        "-std=c99",
        "-fno-omit-frame-pointer",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=undefined",
    ]
# one extension from several C files (the module map: kvevents/native/__init__.py), so one build, one
# import and one fallback line
_SOURCES = [
    "_speedups",
    "_chain",
    "_json",
    "_table",
    "_walk_layout",
    "_walk_args",
    "_walk",
    "_walk_emit",
    "_walk_bound",
    "_apply",
    "_rows",
]
_HEADERS = ["_native", "_sha256", "_feed", "_table", "_holders", "_walk"]
_LINK = ["-fsanitize=address,undefined"] if os.environ.get("KVEVENTS_SANITIZE") == "1" else []


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a compiler error means the pure-Python fallback."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure (no compiler, no headers) is fine
            self._fallback(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._fallback(exc)

    @staticmethod
    def _fallback(exc: BaseException) -> None:
        reason = type(exc).__name__ + (": compiler failed" if "exit status" in str(exc) else f": {str(exc)[:80]}")
        print(f"kvevents: C extension not built ({reason}); the pure-Python fallback is in use", file=sys.stderr)


ext_modules = []
if os.environ.get("KVEVENTS_NO_EXT") != "1" and sys.implementation.name == "cpython":
    ext_modules.append(
        Extension(
            "kvevents.native._speedups",
            sources=[f"kvevents/native/{name}.c" for name in _SOURCES],
            depends=[f"kvevents/native/{name}.h" for name in _HEADERS],
            extra_compile_args=_FLAGS,
            extra_link_args=_LINK,
            optional=True,
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
