"""`conformance hash --profile vllm-*`: cases for an implementation of vLLM 0.33's block-hash chain.

Requests add `hash_algo` ("sha256" pickle or "sha256_cbor"), `seed` (PYTHONHASHSEED or null)
and `hash_extra_keys` (per full block, vLLM's *tagged* keys as JSON arrays, e.g.
`[["lora", name, path], ["cache_salt", salt]]`, or null); `prior` is the parent block's digest
(null: start from NONE_HASH). Only full blocks are hashed. Expected values come from the
golden file `schemas/golden/vllm-0.33.json` (made by running vLLM) and `kvevents.engines.vllm`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from kvevents.conformance.hashkit import GOLDEN_PATH, HashCase
from kvevents.conformance.profiles import ProfileUnavailable

__all__ = ["VLLM_GOLDEN_PATH", "vllm_cases"]

VLLM_GOLDEN_PATH = GOLDEN_PATH.parent / "vllm-0.33.json"


def _engine() -> Any:
    try:
        from kvevents.engines import vllm
    except ImportError as exc:
        raise ProfileUnavailable(f"vLLM hash profiles not available: kvevents.engines.vllm ({exc})") from None
    return vllm


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _case(
    cid: str,
    group: str,
    algo: str,
    tokens: list[int],
    bs: int,
    keys: Any,
    seed: str | None,
    prior: str | None,
    expected: list[str],
) -> HashCase:
    return HashCase(
        cid,
        group,
        tokens,
        bs,
        prior=prior,
        expected=expected,
        int_form="uint64-last8",
        extra={"hash_algo": algo, "seed": seed, "hash_extra_keys": keys},
    )


def vllm_cases(algo: str, seed: int = 20, n: int = 60, golden: Path | str = VLLM_GOLDEN_PATH) -> list[HashCase]:
    """The golden vectors of `algo` plus generated ones (LoRA, salt, PYTHONHASHSEED, continuations)."""
    vllm = _engine()
    try:
        data = json.loads(Path(golden).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"golden file {golden}: {exc}") from None
    out = [
        _case(
            c["name"],
            "golden",
            algo,
            list(c["tokens"]),
            c["block_size"],
            c["hash_extra_keys"],
            c["PYTHONHASHSEED"],
            None,
            list(c["digests"]),
        )  # fmt: skip
        for c in data.get("cases", [])
        if c.get("algo") == algo
    ]
    rng = random.Random(seed)
    for i in range(n):
        out += _generated(vllm, rng, algo, i)
    return out


def _generated(vllm: Any, rng: random.Random, algo: str, i: int) -> list[HashCase]:
    """Generated case i (its draws in a fixed order: the cases are the same for a seed), and when it
    has two blocks or more, a continuation: the blocks after a cut, from the digest before it."""
    bs = rng.choice((1, 2, 4, 16))
    tokens = [rng.randrange(50000) for _ in range(rng.randint(0, 6 * bs + bs - 1))]
    nblocks = len(tokens) // bs
    lora = rng.choice((None, None, "lora-a", "ünï"))
    salt = rng.choice((None, None, "tenant-a"))
    hseed = rng.choice((None, None, "0", "42"))
    tagged = vllm.tagged_extra_keys(
        nblocks, lora_name=lora, lora_path=None if lora is None else f"/a/{lora}", cache_salt=salt
    )
    keys = tagged if any(t is not None for t in tagged) else None
    digests = vllm.vllm_block_hashes(tokens, bs, hash_algo=algo, extra_keys_per_block=keys, seed=hseed)
    json_keys = None if keys is None else [None if t is None else [list(k) for k in t] for t in keys]
    hexes = [d.hex() for d in digests]
    out = [_case(f"vllm-property/{i:03d}", "property", algo, tokens, bs, json_keys, hseed, None, hexes)]
    if nblocks >= 2:
        cut = rng.randint(1, nblocks - 1)
        rest = json_keys[cut:] if json_keys is not None else None
        out.append(
            _case(
                f"vllm-chunked/{i:03d}",
                "chunked",
                algo,
                tokens[cut * bs :],
                bs,
                rest,
                hseed,
                hexes[cut - 1],
                hexes[cut:],
            )
        )
    return out


def tagged_from_json(keys: Any) -> Any:
    """JSON arrays back to vLLM's tuples (what an adapter in Python does with `hash_extra_keys`)."""
    return None if keys is None else [None if k is None else _tuples(k) for k in keys]
