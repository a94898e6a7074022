"""`kvevents hash`: the storage hashes, event hashes and published ids of a token sequence, by the
contract (kvevents.hashing) or by vLLM 0.33's chain (kvevents.engines.vllm): a table, or a record
per page when the table is wider than the terminal; a partial last page is marked (never published)."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional, Sequence

import typer
from rich.table import Table

from kvevents.cli.app import user_error
from kvevents.cli.output import fits, out_console, print_records
from kvevents.hashing import Namespace, event_seed, hash_chains, int64_to_hex16, storage_seed, to_int64

#: `hash -1 ...` is a bad token, not an unknown option
CONTEXT_SETTINGS = {"ignore_unknown_options": True}


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
        digests = _vllm_digests(ids, page_size, profile, extra_key, cache_salt, prior, hash_seed, lora_path)
        if as_json:
            _write_json(_vllm_json(profile, digests))
        else:
            _render_vllm(ids, page_size, profile, prior, hash_seed, digests)
        return
    ns = Namespace(extra_key, cache_salt)
    storage, event = hash_chains(ids, page_size, ns, prior, prior)
    if as_json:
        _write_json({"storage": storage, "event": event, "event_int64": [to_int64(h) for h in event]})
    else:
        _render_contract(ids, page_size, ns, prior, storage, event)


def _write_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")


def _render_contract(
    ids: list[int], page_size: int, ns: Namespace, prior: Optional[str], storage: list[str], event: list[str]
) -> None:
    console = out_console()
    console.print(
        f"namespace extra_key={ns.extra_key!r} cache_salt={ns.cache_salt!r}  page_size={page_size}  "
        f"tokens={len(ids)}  pages={len(event)}",
        highlight=False,
    )
    if prior:
        console.print(f"prior (both chains, no seeding): {prior.lower()}", highlight=False)
    else:
        console.print(f"storage seed: {storage_seed(ns) or '-'}", highlight=False)
        console.print(f"event seed:   {event_seed(ns) or '-'}", highlight=False)
    headers = ("page", "tokens", "storage hash", "event hash", "event int64", "hex16")
    rows = []
    for i, (s, e) in enumerate(zip(storage, event)):
        v = to_int64(e)
        lo = i * page_size
        hi = min(lo + page_size, len(ids))
        span = f"{lo}..{hi - 1}" + (" partial" if hi - lo < page_size else "")
        rows.append((str(i), span, s, e, str(v), int64_to_hex16(v)))
    _print_table(console, headers, rows, right=("page", "tokens", "event int64"))
    tail = len(ids) % page_size
    if tail:
        console.print(
            f"page {len(event) - 1} is partial ({tail} of {page_size} tokens): hashed by the contract, never published",
            highlight=False,
        )


def _print_table(console: Any, headers: tuple[str, ...], rows: Sequence[Sequence[str]], right: tuple[str, ...]) -> None:
    """The rows as a table when it fits the console's width, else as one record per row."""
    table = Table(show_edge=False, header_style="bold")
    for h in headers:
        table.add_column(h, justify="right" if h in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if fits(console, table):
        console.print(table)
    else:
        print_records(console, "", headers, rows)


class _VllmDigests:
    """vLLM 0.33's chain of one token sequence: its algorithm, digests, NONE_HASH and extra keys."""

    def __init__(self, algo: str, digests: list[bytes], head: bytes, extra: list[Any]) -> None:
        from kvevents.engines.vllm import to_event_hash

        self.algo, self.digests, self.head, self.extra = algo, digests, head, extra
        self.ints = [to_event_hash(d) for d in digests]


def _vllm_digests(
    ids: list[int],
    page_size: int,
    profile: str,
    lora: Optional[str],
    salt: Optional[str],
    prior: Optional[str],
    seed: Optional[str],
    lora_path: Optional[str],
) -> _VllmDigests:
    """`kvevents hash --profile vllm-*`: vLLM 0.33's digests and the uint64s its events carry."""
    from kvevents.engines.vllm import PROFILES, none_hash, tagged_extra_keys, untag_extra_keys, vllm_block_hashes

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
    return _VllmDigests(algo, digests, head, [untag_extra_keys(t) for t in tagged])


def _vllm_json(profile: str, d: _VllmDigests) -> dict[str, Any]:
    return {
        "profile": profile,
        "none_hash": d.head.hex(),
        "digests": [x.hex() for x in d.digests],
        "event_block_hashes": d.ints,
        "extra_keys": [list(e) if e is not None else None for e in d.extra],
    }


def _render_vllm(
    ids: list[int], page_size: int, profile: str, prior: Optional[str], seed: Optional[str], d: _VllmDigests
) -> None:
    console = out_console()
    console.print(
        f"profile {profile} (vLLM 0.33, {d.algo})  seed={'PYTHONHASHSEED=' + seed if seed is not None else 'default'}",
        highlight=False,
    )
    console.print(f"block_size={page_size}  tokens={len(ids)}  blocks={len(d.digests)}", highlight=False)
    console.print(
        f"NONE_HASH: {d.head.hex()}" + (f"  (continuing after {prior.lower()})" if prior else ""), highlight=False
    )
    rows = []
    for i, (x, v) in enumerate(zip(d.digests, d.ints)):
        lo = i * page_size
        extra = d.extra[i]
        rows.append(
            (str(i), f"{lo}..{lo + page_size - 1}", x.hex(), str(v), "-" if extra is None else repr(list(extra or ())))
        )
    headers = ("block", "tokens", "digest", "event uint64", "extra_keys")
    _print_table(console, headers, rows, right=("block", "tokens", "event uint64"))
    tail = len(ids) - len(d.digests) * page_size
    if tail:
        console.print(f"{tail} token(s) past the last full block: vLLM hashes whole blocks only", highlight=False)
