"""Typed bundles of command-line flags: a frozen dataclass whose fields are declared with `flag(...)` is
a group of typer options, defined once; `@flag_group(Cls, "name")` puts them into a command where its
parameter `name: Cls = Cls()` stands and hands the command one `Cls` built from the parsed values.

Each field's name is its parameter's name (what `--config` keys map to, kvevents.cli.config), so a
bundle changes neither a flag, its help and panel, nor the order the command lists its flags in.
`inject` is the step underneath, for a bundle whose parameters are built otherwise (`@nats_flags`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Any, Callable, Optional, TypeVar

import typer

from kvevents.cli.helpfmt import in_panel

__all__ = ["flag", "flag_group", "flag_of", "group_parameters", "inject"]

F = TypeVar("F", bound=Callable[..., Any])
_OPTION = "kvevents.cli.option"  # a bundle field's metadata key: its typer.Option


def flag(default: Any, *param_decls: str, **kwargs: Any) -> Any:
    """A bundle field that is `typer.Option(default, *param_decls, **kwargs)`."""
    return flag_of(typer.Option(default, *param_decls, **kwargs))


def flag_of(option: Any) -> Any:
    """A bundle field that is `option` (a typer.Option other commands also take as it is), with the
    option's default as its own (a list default: a fresh empty list). A required option stays in
    its command's signature: every bundle has a default instance."""
    default = option.default
    if default is ...:
        raise TypeError("a bundle holds optional flags only (every bundle has a default instance)")
    meta = {_OPTION: option}
    if isinstance(default, list):
        if default:
            raise TypeError("a list flag's default is []")
        return dataclasses.field(default_factory=list, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def group_parameters(cls: type, panel: Optional[str] = None) -> list[inspect.Parameter]:
    """The bundle's flags as parameters (in field order), each under `panel` when one is given."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        option = f.metadata.get(_OPTION)
        if option is not None:
            option = in_panel(option, panel) if panel is not None else option
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD  # inject gives it the placeholder's kind
            out.append(inspect.Parameter(f.name, kind, default=option, annotation=hints[f.name]))
    return out


def inject(fn: F, name: str, params: list[inspect.Parameter], build: Callable[..., Any]) -> F:
    """`fn` with its parameter `name` replaced, in place, by `params`; the command built on it calls
    `fn(..., name=build(**values of params))`."""
    sig = inspect.signature(fn, eval_str=True)
    if name not in sig.parameters:
        raise TypeError(f"{fn.__name__} has no parameter {name!r} to put its flags in")
    clash = {p.name for p in params} & (set(sig.parameters) - {name})  # a flag may be named as its bundle
    if clash:
        raise TypeError(f"{fn.__name__}: parameter(s) {', '.join(sorted(clash))} given twice")
    kind = sig.parameters[name].kind
    spliced: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        spliced.extend([q.replace(kind=kind) for q in params] if p.name == name else [p])
    names = [p.name for p in params]

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        values = {n: kwargs.pop(n) for n in names if n in kwargs}
        return fn(*args, **{name: build(**values)}, **kwargs)

    command.__signature__ = sig.replace(parameters=spliced)  # type: ignore[attr-defined]
    # typer reads the annotations too (typing.get_type_hints): they follow the new signature
    annotations = {p.name: p.annotation for p in spliced if p.annotation is not inspect.Parameter.empty}
    if sig.return_annotation is not inspect.Signature.empty:
        annotations["return"] = sig.return_annotation
    command.__annotations__ = annotations
    return command  # type: ignore[return-value]


def flag_group(cls: type, name: str, panel: Optional[str] = None) -> Callable[[F], F]:
    """Decorator: the flags of bundle `cls` in place of the command's parameter `name` (the bundle's
    flags shown under `panel` when one is given)."""

    def decorate(fn: F) -> F:
        return inject(fn, name, group_parameters(cls, panel), cls)

    return decorate
