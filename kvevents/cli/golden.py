"""`kvevents golden`: this installation against the golden vectors (checks in kvevents.golden)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kvevents.cli.app import CheckFailed, user_error
from kvevents.cli.output import fits, out_console, print_records


def default_golden_dir() -> Path:
    """The golden vectors shipped with the package (kvevents/schemas/golden: in a checkout a
    symlink to the repository's schemas/, in a wheel its copy), else the checkout's schemas/golden."""
    shipped = Path(__file__).resolve().parents[1] / "schemas" / "golden"
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[2] / "schemas" / "golden"


def _golden_files(path: Optional[Path]) -> list[Path]:
    target = path if path is not None else default_golden_dir()
    if target.is_dir():
        files = sorted(target.glob("*.json"))
        if not files:
            user_error(f"no golden *.json files in {target}")
        return files
    if target.is_file():
        return [target]
    hint = "" if path is not None else " (an incomplete install? pass --golden PATH)"
    user_error(f"golden vectors not found: {target}{hint}")


def _load(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        user_error(f"cannot read {file}: {exc}")
    except (json.JSONDecodeError, RecursionError) as exc:
        user_error(f"{file} is not valid JSON: {exc}")
    if not isinstance(data, dict):
        user_error(f"{file}: expected a JSON object of golden vectors")
    from kvevents.golden import SGLANG_SECTIONS, golden_kind

    if golden_kind(data) is None:
        user_error(
            f"{file} is not a golden file: it has none of the sections {', '.join(SGLANG_SECTIONS)} "
            "(nor vLLM cases with an algo)"
        )
    return data


def _table(file: Path, items: list[Any]) -> Table:
    table = Table(title=f"golden: {file.name}", show_edge=False, header_style="bold")
    table.add_column("section", no_wrap=True)
    table.add_column("item", no_wrap=True)
    table.add_column("checks", justify="right", no_wrap=True)
    table.add_column("result", no_wrap=True)
    for item in items:
        section, name = escape(item.section), escape(item.name)  # names like `[null, null]` are not markup
        result = "[green]pass[/green]" if item.ok else f"[red]FAIL[/red] {escape(item.detail)}"
        table.add_row(section, name, str(item.checks), result)
    return table


def golden(
    golden_path: Optional[Path] = typer.Option(
        None,
        "--golden",
        help="A golden JSON file or a directory of them (default: the vectors shipped with kvevents, schemas/golden).",
    ),
) -> None:
    """Check this installation against the golden vectors; exit 1 on any mismatch."""
    from kvevents.golden import check_golden

    console = out_console()
    failed = total = 0
    for file in _golden_files(golden_path):
        items = check_golden(_load(file))
        if not items:
            raise CheckFailed(f"{file}: no golden items to check (an empty file proves nothing)")
        total += len(items)
        failed += sum(1 for item in items if not item.ok)
        table = _table(file, items)
        if fits(console, table):
            console.print(table)
        else:  # a failure's detail is too wide for the table: one record per item
            rows = [(f"{i.section} {i.name}", str(i.checks), "pass" if i.ok else f"FAIL {i.detail}") for i in items]
            print_records(console, f"golden: {file.name}", ("item", "checks", "result"), rows)
    console.print(f"{total - failed} of {total} golden items pass")
    if failed:
        raise CheckFailed(f"{failed} of {total} golden items do not match")
    if total == 0:
        raise CheckFailed("no golden items were checked")
