"""kvevents inside engines: plug-ins an engine loads through its own entry-point group.

`PLUGINS` maps each engine to the module holding its plug-in and the entry-point group that engine
reads (declared in pyproject.toml). A plug-in module imports nothing of its engine at module import
time: kvevents stays importable without any engine installed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PLUGINS", "EnginePlugin"]


@dataclass(frozen=True)
class EnginePlugin:
    """One engine's plug-in: its module, the engine's entry-point group, and the entry's name."""

    module: str
    group: str
    name: str
    entry: str  # "module:function" as pyproject declares it


PLUGINS: dict[str, EnginePlugin] = {
    "sglang": EnginePlugin(
        module="kvevents.plugins.sglang",
        group="sglang.srt.plugins",
        name="kvevents",
        entry="kvevents.plugins.sglang:register",
    ),
}
