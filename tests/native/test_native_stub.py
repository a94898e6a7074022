"""kvevents/native/_speedups.pyi types exactly what the built extension exports, and ships with the package."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from kvevents import native

STUB = Path(native.__file__).with_name("_speedups.pyi")
REPO = Path(__file__).resolve().parents[2]


def _stub_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(STUB.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _stub_classes() -> dict[str, ast.ClassDef]:
    tree = ast.parse(STUB.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


@pytest.mark.skipif(not native.HAVE_C, reason="kvevents.native._speedups not built")
def test_the_stub_names_every_function_of_the_extension_and_no_other():
    from kvevents.native import _speedups

    public = {name: f for name, f in vars(_speedups).items() if callable(f) and not name.startswith("_")}
    assert set(_stub_functions()) == {name for name, f in public.items() if not isinstance(f, type)}
    assert set(_stub_classes()) == {name for name, f in public.items() if isinstance(f, type)}


def test_the_stub_types_every_parameter_and_result_positional_only():
    for name, fn in _stub_functions().items():
        a = fn.args
        assert not a.args and not a.kwonlyargs and a.vararg is None and a.kwarg is None, name  # C takes no keywords
        assert fn.returns is not None and all(p.annotation is not None for p in a.posonlyargs), name


def test_the_stub_and_the_type_marker_are_package_data():
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is 3.11+")
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "_speedups.pyi" in data["kvevents.native"] and "py.typed" in data["kvevents"]
    assert (REPO / "kvevents" / "py.typed").is_file()
