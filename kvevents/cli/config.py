"""`--config FILE.toml` and `--print-config` for the long-running commands (route, bridge, relay, serve):
a deployment in one file instead of a long command line.

The file's keys are the command's flags without `--` (`page-size = 16`, `publisher = ["w0=..."]`,
`lora-strict = false`; `_` may stand for `-`); a table named after a command (`[route]`, `[serve]`)
holds that command's keys, so one file can hold a whole deployment (a command reads the top-level
keys and its own table, never another command's). Flags given on the command line override the
file, which overrides the defaults (click's default map). An unknown key or a value of the wrong
type is one line and exit 2. `--print-config` prints the settings the command would run with, as
TOML `--config` reads back, and exits 0. TOML is read by tomllib (Python 3.11+) or, on older
Pythons, by the tomli package when it is installed.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
from collections.abc import Callable
from typing import Any, Optional, TypeVar

import typer

from kvevents.cli.app import user_error
from kvevents.cli.output import out_line

__all__ = ["takes_config", "read_toml", "to_toml", "COMMAND_TABLES"]

F = TypeVar("F", bound=Callable[..., Any])
COMMAND_TABLES = ("route", "bridge", "relay", "serve")  # the commands that take --config
_OWN = ("config", "print_config", "help")  # not settings
SECRETS = frozenset({"api_key", "read_only_key"})  # settings --print-config never prints


def read_toml(path: str) -> dict[str, Any]:
    """A TOML file as a dict; one user_error line when it is missing, unreadable or not TOML, or when
    this Python has no TOML reader."""
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError:  # Python < 3.11
        try:
            import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ModuleNotFoundError:
            user_error("--config needs Python 3.11 or newer (tomllib), or the tomli package installed")
    if not os.path.isfile(path):
        user_error(f"--config {path}: no such file")
    try:
        with open(path, "rb") as f:
            return dict(tomllib.load(f))
    except OSError as exc:
        user_error(f"--config {path}: {exc.strerror or exc}")
    except tomllib.TOMLDecodeError as exc:
        user_error(f"--config {path}: not valid TOML: {exc}")


def _is_setting(p: Any) -> bool:
    return getattr(p, "param_type_name", "") == "option" and p.name not in _OWN


def _options(command: Any) -> dict[str, tuple[Any, bool]]:
    """Key (a flag without --) -> (its option, whether the key negates it: `no-lora-strict`)."""
    out: dict[str, tuple[Any, bool]] = {}
    for p in command.params:
        if _is_setting(p):
            for opt in p.opts:
                if opt.startswith("--"):
                    out[opt[2:]] = (p, False)
            for opt in p.secondary_opts:
                if opt.startswith("--"):
                    out[opt[2:]] = (p, True)
    return out


def _settings(data: dict[str, Any], command: str) -> dict[str, Any]:
    """The keys that apply to `command`: the top level and its own table (which wins)."""
    out = {k: v for k, v in data.items() if not (k in COMMAND_TABLES and isinstance(v, dict))}
    own = data.get(command)
    if isinstance(own, dict):
        out.update(own)
    return out


def default_map(ctx: typer.Context, path: str) -> dict[str, Any]:
    """The file's settings for ctx's command as click's default map {param name: value}, each value
    checked against its option's type (one line and exit 2 on an unknown key or a bad value)."""
    options = _options(ctx.command)
    settings = _settings(read_toml(path), str(ctx.info_name))
    unknown = [k for k in settings if k.replace("_", "-") not in options]
    if unknown:
        user_error(
            f"--config {path}: unknown key(s) {', '.join(unknown)} (keys are the flags of "
            f"`kvevents {ctx.info_name}` without --, e.g. {next(iter(options))})"
        )
    out: dict[str, Any] = {}
    for key, value in settings.items():
        param, negated = options[key.replace("_", "-")]
        if param.multiple and not isinstance(value, list):
            value = [value]
        if negated and isinstance(value, bool):
            value = not value
        try:
            param.process_value(ctx, value)  # the checks a flag's value gets: type, range, choices
        except (typer.TyperException, TypeError, ValueError) as exc:
            message = exc.format_message() if isinstance(exc, typer.TyperException) else str(exc)
            user_error(f"--config {path}: {key} = {value!r}: {message}")
        out[str(param.name)] = value
    return out


def _load(ctx: typer.Context, param: typer.CallbackParam, value: Optional[str]) -> Optional[str]:
    """--config's eager callback: the file becomes the defaults of every other flag."""
    if value is not None:
        ctx.default_map = {**(ctx.default_map or {}), **default_map(ctx, value)}
    return value


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def to_toml(ctx: typer.Context) -> list[str]:
    """The command's settings (ctx.params after parsing) as TOML lines, in --help order; a flag
    without a value is a comment."""
    lines = [f"# kvevents {ctx.info_name}: the settings it runs with (flags over --config over defaults)"]
    for p in ctx.command.params:
        if not _is_setting(p):
            continue
        key = next((o[2:] for o in p.opts if o.startswith("--")), str(p.name))
        value = ctx.params.get(str(p.name))
        if value is None:
            lines.append(f"# {key} = (not set)")
        elif p.name in SECRETS:  # a printed config ends up in files and logs: the key stays where it came from
            lines.append(f"# {key} = (set; not printed: give it by its flag or environment variable)")
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    return lines


CONFIG = typer.Option(
    None,
    "--config",
    metavar="FILE.toml",
    is_eager=True,
    callback=_load,
    help="Settings from TOML (flags win).",
)
PRINT_CONFIG = typer.Option(False, "--print-config", help="Print them as --config TOML; exit.")


def takes_config(fn: F) -> F:
    """Give a command `--config FILE.toml` and `--print-config` (module docstring); the command itself
    is unchanged."""
    sig = inspect.signature(fn, eval_str=True)
    extra = [
        inspect.Parameter("config_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=CONFIG, annotation=Optional[str]),
        inspect.Parameter("print_config", inspect.Parameter.KEYWORD_ONLY, default=PRINT_CONFIG, annotation=bool),
    ]

    @functools.wraps(fn)
    def command(
        *args: Any, config_ctx: typer.Context, config: Optional[str] = None, print_config: bool = False, **kwargs: Any
    ) -> Any:
        if print_config:
            for line in to_toml(config_ctx):
                out_line(line)
            raise typer.Exit(0)
        return fn(*args, **kwargs)

    command.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])  # type: ignore[attr-defined]
    return command  # type: ignore[return-value]
