"""Which verifier `log inspect --verify --profile P` runs: the contract's or a vLLM 0.33 stream's."""

from __future__ import annotations

import os
from typing import Any, Iterable

from kvevents.recordlog.verify import ContractVerifier
from kvevents.recordlog.verify_vllm import VllmVerifier, parse_lora_paths

__all__ = ["make_verifier"]


def make_verifier(
    profile: str, page_size: int | None, salts: Iterable[str] = (), lora_paths: Iterable[str] = ()
) -> Any:
    """The verifier for `log inspect --verify --profile P`: the contract or a vLLM 0.33 stream
    (`vllm`: structure and links; `vllm-sha256` / `vllm-sha256_cbor`: hashes too, seeded by
    PYTHONHASHSEED from the environment when set, as vLLM is). Without a page size each event is
    checked at its own block_size. ValueError on bad input."""
    if profile == "contract":
        return ContractVerifier(page_size, salts)
    return VllmVerifier(
        profile,
        hash_seed=os.environ.get("PYTHONHASHSEED"),
        lora_paths=parse_lora_paths(lora_paths),
        page_size=page_size,
    )
