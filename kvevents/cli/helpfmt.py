"""How `--help` reads: placeholders, the type column, docstrings as paragraphs, option panels.

Typer renders required arguments as `{file}`, repeatable options as `TEXT...` (as if one flag
took several values), ranges as `[1<=x<=64]` and `[default: ...]` on a line of its own; a
docstring's single line breaks would print as breaks mid-sentence. This module puts that right in
one place: `install()` (called once by kvevents.cli.app) sets the placeholders, the type column
and the option help's layout; `reflow_help(app)` (called once the commands are registered) turns
each command's docstring into paragraphs; `in_panel` files a shared option under a heading.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import typer
from rich.text import Text
from typer import rich_utils
from typer.core import TyperArgument, TyperOption

__all__ = ["install", "reflow", "reflow_help", "in_panel", "placeholder"]

_TYPE_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "file": "FILE", "directory": "DIR"}


def _arg_name(param: TyperArgument) -> str:
    return param.metavar or (param.name or "arg").upper()


def placeholder(param: TyperArgument) -> str:
    """An argument in the usage line: FILE, TOKENS... for several, [FILE] when optional."""
    name = _arg_name(param)
    if not param.required:
        name = f"[{name}]"
    return name + ("..." if param.nargs != 1 else "")


def _error_hint(param: TyperArgument) -> str:
    """An argument in an error line as in the usage line: "Missing argument 'FILE'"."""
    return f"'{_arg_name(param)}'"


def _type_column(param: TyperOption | TyperArgument, ctx: Any) -> str | None:
    """The help's type column in plain words (TEXT, INTEGER, ...): no `<bool>`-style tags, nothing
    for flags, and `...` only where one occurrence takes several values (an argument's TOKENS...),
    never for a repeatable option (`--salt TEXT`, given once per value)."""
    if param.metavar is not None:
        return param.metavar
    if getattr(param, "is_flag", False):
        return None
    label = type(param).display_type(param, ctx).strip("<>")
    if label.startswith("list["):
        label = label[5:-1]
    word = label.split()[0] if label else ""
    name = _TYPE_WORDS.get(word, word.upper())
    return f"{name}..." if param.nargs != 1 else name


def _range(param: Any) -> str | None:
    """A number's bounds as short as they read: 1..64, >=0 (typer's `1<=x<=64` widens the type column)."""
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if lo is not None and hi is not None:
        return f"{lo:g}..{hi:g}"
    if lo is not None:
        return f">={lo:g}"
    return f"<={hi:g}" if hi is not None else None


def _one_paragraph(original: Any) -> Any:
    """An option's help, `[default: ...]` and `[required]` as one paragraph: typer lays them out as
    columns, so each tag takes a line of its own in a narrow help column."""

    def parameter_help(**kwargs: Any) -> Any:
        cols = original(**kwargs)
        parts = list(getattr(cols, "renderables", ()))
        if not parts or not all(isinstance(p, Text) for p in parts):
            return cols
        return Text(" ").join(parts)

    return parameter_help


def install() -> None:
    """Our wording of the usage line's placeholders, of the type column and of option help, for
    every command."""
    original = getattr(rich_utils, "_get_parameter_help", None)  # absent in another typer: typer's layout
    if original is not None and not getattr(rich_utils, "_kvevents_one_paragraph", False):  # once only
        rich_utils._get_parameter_help = _one_paragraph(original)  # type: ignore[attr-defined]
        rich_utils._kvevents_one_paragraph = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = _type_column  # type: ignore[method-assign, assignment]
    TyperArgument.display_type_rich = _type_column  # type: ignore[method-assign, assignment]
    TyperArgument._usage_display_name = placeholder  # type: ignore[method-assign, assignment]
    TyperArgument.get_error_hint = _error_hint  # type: ignore[method-assign, assignment]
    TyperOption._get_number_range_help_str = _range  # type: ignore[method-assign, assignment]
    TyperArgument._get_number_range_help_str = _range  # type: ignore[method-assign, assignment]


def reflow(text: str) -> str:
    """A docstring as paragraphs: single line breaks become spaces; blank lines stay, and so does a
    paragraph marked `\\b` (click's "keep my line breaks")."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def reflow_help(app: typer.Typer) -> None:
    """Every registered command's help text (or docstring) reflowed, in `app` and its groups."""
    for info in app.registered_commands:
        text = info.help if info.help is not None else inspect.getdoc(info.callback)
        if text:
            info.help = reflow(text)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)


def in_panel(option: Any, panel: str) -> Any:
    """A copy of a shared typer.Option (kvevents.cli.options) shown under `panel` in one command's help."""
    out = copy.copy(option)
    out.rich_help_panel = panel
    return out
