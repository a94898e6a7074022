"""kvevents.cli.flag_groups: a bundle's flags stand where its placeholder stood (order, panel, type,
help kept), the command gets one typed bundle, `--config` sees each flag; and the NATS trust flags
of route, record, fetch and doctor come from one declaration."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import typer
from typer.testing import CliRunner

from kvevents.cli.config import takes_config
from kvevents.cli.flag_groups import flag, flag_group, flag_of
from kvevents.cli.options import SIGN_KEY, NatsFlags
from tests.helpers.cli import invoke


@dataclass(frozen=True)
class _Front:
    front: bool = flag(False, "--front", help="A flag named as its bundle.")
    names: list[str] = flag([], "--name", help="Repeatable.")
    wait: float = flag(2.5, "--wait", min=0.0, help="Seconds.")


def _app(seen: list[Any]) -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.command()
    @takes_config
    @flag_group(_Front, "front", "Front panel")
    def cmd(
        first: int = typer.Option(1, "--first"),
        front: _Front = _Front(),
        last: Optional[str] = typer.Option(None, "--last"),
    ) -> None:
        seen.append((first, front, last))

    @app.command()
    def other() -> None:  # a second command: typer then needs the command's name
        pass

    return app


def test_the_bundle_is_built_from_the_flags_and_they_keep_their_place_and_type(tmp_path: Path) -> None:
    seen: list[Any] = []
    app = _app(seen)
    runner = CliRunner()
    res = runner.invoke(app, ["cmd", "--front", "--name", "a", "--name", "b", "--last", "z"])
    assert res.exit_code == 0, res.output
    assert seen == [(1, _Front(front=True, names=["a", "b"], wait=2.5), "z")]
    cmd = typer.main.get_command(app).commands["cmd"]  # type: ignore[attr-defined]
    names = [p.name for p in cmd.params]
    assert names[:5] == ["first", "front", "names", "wait", "last"]
    front = cmd.params[1]
    assert front.is_flag and front.rich_help_panel == "Front panel"  # a bool flag, not a _Front value
    assert cmd.params[3].min == 0.0
    (tmp_path / "c.toml").write_text('front = true\nname = ["x"]\nwait = 1.0\n')
    res = runner.invoke(app, ["cmd", "--config", str(tmp_path / "c.toml")])
    assert res.exit_code == 0, res.output
    assert seen[-1] == (1, _Front(front=True, names=["x"], wait=1.0), None)
    res = runner.invoke(app, ["cmd", "--wait", "3", "--print-config"])
    assert "wait = 3.0" in res.output and "name = []" in res.output


def test_a_bundle_needs_its_placeholder_and_holds_only_optional_flags() -> None:
    def no_place(first: int = 1) -> None: ...

    with pytest.raises(TypeError, match="no parameter 'front'"):
        flag_group(_Front, "front")(no_place)

    def clash(front: _Front = _Front(), wait: float = 1.0) -> None: ...

    with pytest.raises(TypeError, match="wait"):
        flag_group(_Front, "front")(clash)
    with pytest.raises(TypeError, match="optional"):
        flag(..., "--needed")
    assert flag_of(SIGN_KEY).default is None


@pytest.mark.parametrize("command", ["route", "record", "fetch", "doctor"])
def test_the_nats_trust_flags_are_one_declaration(command: str) -> None:
    from kvevents.cli.app import app

    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    by_name = {p.name: p for p in cmd.params}
    assert by_name["sign_key"].help == SIGN_KEY.help and by_name["sign_key"].help.startswith("With --nats: ")
    assert by_name["sign_key"].rich_help_panel == by_name["nats_creds"].rich_help_panel == "NATS connection"
    assert ("max_sources" in by_name) == (command != "doctor")


def test_the_command_gets_the_trust_flags_in_its_nats_bundle(tmp_path: Path) -> None:
    key = tmp_path / "bus.key"
    assert invoke("keys", "sign-key", str(key)).returncode == 0
    # the key is read (a bad one is named), so it reached the command through NatsFlags
    key.write_text("not a key\n")
    res = invoke("fetch", "--nats", "nats://127.0.0.1:1", "-o", str(tmp_path / "x.kvlog"), "--sign-key", str(key))
    assert res.returncode == 2 and "--sign-key" in res.stderr, res.stderr
    assert not (tmp_path / "x.kvlog").exists()
    fields = inspect.signature(NatsFlags).parameters
    assert list(fields)[-3:] == ["sign_key", "insecure", "max_sources"]
