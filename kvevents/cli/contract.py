"""kvevents CLI commands for the contract layer: `hash`, `schema`, `golden`, `version`.

Thin wrappers: parse, call kvevents.hashing / kvevents.events, render. The golden check lives in
kvevents.golden so this module stays a face.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvevents.cli.app import CheckFailed, app, user_error
from kvevents.hashing import Namespace, event_seed, hash_chains, int64_to_hex16, storage_seed, to_int64


def _console() -> Console:
    """A stdout console that never truncates 64-char hashes when output is piped."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=240)
    return console


def _parse_tokens(raw: list[str]) -> list[int]:
    """Token ids from arguments; each argument may also be a comma-separated list."""
    out: list[int] = []
    for arg in raw:
        for part in arg.replace(",", " ").split():
            try:
                out.append(int(part, 10))  # a negative id is parsed here and refused by the range check
            except ValueError:
                if part.startswith("-"):  # unknown options reach here (the command lets `-1` through as a token)
                    user_error(f"no such option: {part} (token ids are integers in 0..2**32-1)")
                user_error(f"token {part!r} is not an integer")
    return out


@app.command("hash", context_settings={"ignore_unknown_options": True})  # `hash -1 ...`: a bad token, not an option
def hash_cmd(
    tokens: list[str] = typer.Argument(..., help="Token ids (space or comma separated), each in 0..2**32-1."),
    page_size: int = typer.Option(..., "--page-size", "-p", help="Tokens per page (>= 1)."),
    extra_key: Optional[str] = typer.Option(None, "--extra-key", help="Namespace extra key (LoRA id, variant)."),
    cache_salt: Optional[str] = typer.Option(None, "--cache-salt", help="Namespace tenant salt."),
    prior: Optional[str] = typer.Option(
        None, "--prior", help="Continue both chains from this 64-hex digest (no seeding)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: storage, event, event_int64."),
    profile: str = typer.Option(
        "contract",
        "--profile",
        help="contract (kvevents / SGLang 0.5.20), or vLLM 0.33's chain: vllm-sha256 | vllm-sha256_cbor "
        "(--extra-key is then the LoRA name, --prior the parent digest).",
    ),
    hash_seed: Optional[str] = typer.Option(
        None, "--hash-seed", help="vLLM profiles: PYTHONHASHSEED (default: unset)."
    ),
    lora_path: Optional[str] = typer.Option(None, "--lora-path", help="vLLM profiles: the LoRA adapter path."),
) -> None:
    """Print the storage hashes, event hashes and published int64s of a token sequence."""
    ids = _parse_tokens(tokens)
    if profile != "contract":
        _vllm_hash(ids, page_size, profile, extra_key, cache_salt, prior, hash_seed, lora_path, as_json)
        return
    ns = Namespace(extra_key, cache_salt)
    storage, event = hash_chains(ids, page_size, ns, prior, prior)
    ints = [to_int64(h) for h in event]
    if as_json:
        sys.stdout.write(json.dumps({"storage": storage, "event": event, "event_int64": ints}) + "\n")
        return
    console = _console()
    s_seed = storage_seed(ns) if not prior else None
    e_seed = event_seed(ns) if not prior else None
    console.print(
        f"namespace extra_key={ns.extra_key!r} cache_salt={ns.cache_salt!r}  page_size={page_size}  "
        f"tokens={len(ids)}  pages={len(event)}"
    )
    if prior:
        console.print(f"prior (both chains, no seeding): {prior.lower()}")
    else:
        console.print(f"storage seed: {s_seed or '-'}")
        console.print(f"event seed:   {e_seed or '-'}")
    table = Table(show_edge=False, header_style="bold")
    table.add_column("page", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("storage hash", no_wrap=True)
    table.add_column("event hash", no_wrap=True)
    table.add_column("event int64", justify="right", no_wrap=True)
    table.add_column("hex16", no_wrap=True)
    for i, (s, e, v) in enumerate(zip(storage, event, ints)):
        lo = i * page_size
        hi = min(lo + page_size, len(ids))
        table.add_row(str(i), f"{lo}..{hi - 1}", s, e, str(v), int64_to_hex16(v))
    console.print(table)


def _vllm_hash(
    ids: list[int],
    page_size: int,
    profile: str,
    lora: Optional[str],
    salt: Optional[str],
    prior: Optional[str],
    seed: Optional[str],
    lora_path: Optional[str],
    as_json: bool,
) -> None:
    """`kvevents hash --profile vllm-*`: vLLM 0.33's digests and the uint64s its events carry."""
    from kvevents.engines.vllm import (
        PROFILES,
        none_hash,
        tagged_extra_keys,
        to_event_hash,
        untag_extra_keys,
        vllm_block_hashes,
    )

    algo = PROFILES.get(profile)
    if algo is None:
        user_error(f"--profile must be contract or one of {', '.join(PROFILES)}, got {profile!r}")
    try:
        parent = bytes.fromhex(prior) if prior else None
        if parent is not None and len(parent) != 32:
            raise ValueError("--prior must be a 64-hex digest")
        n = len(ids) // page_size if page_size > 0 else 0
        tagged = tagged_extra_keys(n, lora_name=lora, lora_path=lora_path, cache_salt=salt if parent is None else None)
        digests = vllm_block_hashes(
            ids,
            page_size,
            hash_algo=algo,
            seed=seed,
            parent=parent,
            extra_keys_per_block=tagged if any(t is not None for t in tagged) else None,
        )
        head = none_hash(algo, seed)
    except ValueError as exc:
        user_error(str(exc))
    ints = [to_event_hash(d) for d in digests]
    extra = [untag_extra_keys(t) for t in tagged]
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "profile": profile,
                    "none_hash": head.hex(),
                    "digests": [d.hex() for d in digests],
                    "event_block_hashes": ints,
                    "extra_keys": [list(e) if e is not None else None for e in extra],
                }
            )
            + "\n"
        )
        return
    console = _console()
    console.print(
        f"profile {profile} (vLLM 0.33, {algo})  block_size={page_size}  tokens={len(ids)}  blocks={len(digests)}"
        f"  seed={'PYTHONHASHSEED=' + seed if seed is not None else 'default'}"
    )
    console.print(f"NONE_HASH: {head.hex()}" + (f"  (continuing after {prior.lower()})" if prior else ""))
    table = Table(show_edge=False, header_style="bold")
    for col, just in (
        ("block", "right"),
        ("tokens", "right"),
        ("digest", "left"),
        ("event uint64", "right"),
        ("extra_keys", "left"),
    ):
        table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for i, (d, v) in enumerate(zip(digests, ints)):
        lo = i * page_size
        table.add_row(
            str(i),
            f"{lo}..{lo + page_size - 1}",
            d.hex(),
            str(v),
            "-" if extra[i] is None else repr(list(extra[i] or ())),
        )
    console.print(table)


@app.command()
def schema() -> None:
    """Print the JSON Schema of a batch payload (generated from the event structs)."""
    from kvevents.events import batch_json_schema

    sys.stdout.write(json.dumps(batch_json_schema(), indent=2) + "\n")


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


@app.command()
def golden(
    golden_path: Optional[Path] = typer.Option(
        None,
        "--golden",
        help="A golden JSON file or a directory of them (default: the vectors shipped with kvevents, schemas/golden).",
    ),
) -> None:
    """Check this installation against the golden vectors; exit 1 on any mismatch."""
    from kvevents.golden import check_golden

    console = _console()
    failed = 0
    total = 0
    for file in _golden_files(golden_path):
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            user_error(f"cannot read {file}: {exc}")
        except (json.JSONDecodeError, RecursionError) as exc:
            user_error(f"{file} is not valid JSON: {exc}")
        if not isinstance(data, dict):
            user_error(f"{file}: expected a JSON object of golden vectors")
        items = check_golden(data)
        if not items:
            raise CheckFailed(f"{file}: no golden items to check (an empty file proves nothing)")
        table = Table(title=f"golden: {file.name}", show_edge=False, header_style="bold")
        table.add_column("section")
        table.add_column("item")
        table.add_column("checks", justify="right")
        table.add_column("result")
        for item in items:
            total += 1
            section, name = escape(item.section), escape(item.name)  # names like `[null, null]` are not markup
            if item.ok:
                table.add_row(section, name, str(item.checks), "[green]pass[/green]")
            else:
                failed += 1
                table.add_row(section, name, str(item.checks), f"[red]FAIL[/red] {escape(item.detail)}")
        console.print(table)
    console.print(f"{total - failed} of {total} golden items pass")
    if failed:
        raise CheckFailed(f"{failed} of {total} golden items do not match")
    if total == 0:
        raise CheckFailed("no golden items were checked")


@app.command()
def version() -> None:
    """Print the kvevents version, then which hashing/index path runs (compiled or pure Python)."""
    from kvevents import __version__, native

    print(__version__)
    print(native.describe())
