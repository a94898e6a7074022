"""Hash profiles: how a published BlockStored's hashes are recomputed from its token_ids.

`contract` is this project's event chain (SGLang 0.5.20: SHA-256 over u32-LE pages, seeded by
cache_salt, published as the first 8 digest bytes). The vLLM entries call the vLLM hashing
profile in `kvevents.engines.vllm` when it is installed and report "profile not available" if not.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kvevents.hashing import (
    Namespace,
    digest_chain,
    digests_to_int64,
    event_hashes_int64,
    event_seed,
    pack_tokens,
    split_pages,
)
from kvevents.zeromq.wire import HASH_SCHEME

__all__ = ["PROFILES", "ContractProfile", "NotCheckable", "Profile", "ProfileUnavailable", "VllmProfile", "get_profile"]


class NotCheckable(ValueError):
    """This block cannot be recomputed from what the event carries (not a failure)."""


class ProfileUnavailable(ValueError):
    """The named profile needs a module that is not installed (or lacks the expected function)."""


class Profile(Protocol):
    """Recompute one BlockStored: a chain head's prior, the page digests, their published ints."""

    name: str
    hash_scheme: str | None  # what KVE/DESCRIBE should say, if anything
    adapter_invariant: bool  # True: an adapter (extra_key) never moves a published hash

    def head_prior(self, fields: dict[str, Any]) -> bytes | None: ...

    def digests(self, fields: dict[str, Any], prior: bytes | None) -> list[bytes]: ...

    def published(self, digests: Sequence[bytes], fields: dict[str, Any] | None = None) -> list[int]: ...

    def prompt_hashes(
        self, tokens: Sequence[int], page_size: int, *, salt: str | None, lora: str | None
    ) -> list[int]: ...


class ContractProfile:
    """The contract's event chain; `fields` is the decoded event map (cache_salt seeds heads)."""

    name = "contract"
    hash_scheme: str | None = HASH_SCHEME
    adapter_invariant = True

    def head_prior(self, fields: dict[str, Any]) -> bytes | None:
        salt = fields.get("cache_salt")
        seed = event_seed(Namespace(None, salt if isinstance(salt, str) else None))
        return bytes.fromhex(seed) if seed else None

    def digests(self, fields: dict[str, Any], prior: bytes | None) -> list[bytes]:
        pages = split_pages(pack_tokens(fields["token_ids"]), fields["block_size"])
        return digest_chain(pages, prior)

    def published(self, digests: Sequence[bytes], fields: dict[str, Any] | None = None) -> list[int]:
        return digests_to_int64(list(digests))

    def prompt_hashes(self, tokens: Sequence[int], page_size: int, *, salt: str | None, lora: str | None) -> list[int]:
        """What a fresh prompt's full pages publish (for `conformance drive`): lora never counts."""
        full = list(tokens)[: len(tokens) // page_size * page_size]
        return event_hashes_int64(full, page_size, Namespace(None, salt))


def _signed_tail(d: bytes) -> int:
    """vLLM publishes the last 8 digest bytes as uint64; our decoder reads that as signed int64."""
    return int.from_bytes(d[-8:], "big", signed=True)


class VllmProfile:
    """vLLM 0.33's block-hash chain through `kvevents.engines.vllm` (imported on first use).

    Events carry extra_keys untagged; they are re-tagged here (the lora name, (mm id, offset)
    pairs, the salt, an embeds digest). The LoRA path is hashed but never published: LoRA blocks
    are checkable only with `lora_path` (a template, `{name}` replaced by the lora name).
    """

    hash_scheme: str | None = None
    adapter_invariant = False  # vLLM hashes ("lora", name, path) into every block of a LoRA request

    def __init__(self, hash_algo: str, *, seed: str | None = None, lora_path: str | None = None) -> None:
        self.hash_algo = hash_algo
        self.name = f"vllm-{hash_algo}"
        self.seed = seed
        self.lora_path = lora_path
        self._mod: Any = None

    def _load(self) -> Any:
        if self._mod is None:
            try:
                mod = importlib.import_module("kvevents.engines.vllm")
            except ImportError as exc:
                raise ProfileUnavailable(f"profile {self.name} not available: kvevents.engines.vllm ({exc})") from None
            if not callable(getattr(mod, "vllm_block_hashes", None)):
                raise ProfileUnavailable(
                    f"profile {self.name} not available: kvevents.engines.vllm has no vllm_block_hashes"
                )
            self._mod = mod
        return self._mod

    def check_available(self) -> None:
        """Raise ProfileUnavailable now rather than on the first event."""
        self._load()

    def head_prior(self, fields: dict[str, Any]) -> bytes | None:
        return None  # vllm_block_hashes starts from NONE_HASH itself

    def _lora_key(self, name: str) -> tuple[str, str, str]:
        if self.lora_path is None:
            raise NotCheckable(
                "a LoRA block's hash includes the adapter path, which events do not carry (give --lora-path)"
            )
        return ("lora", name, self.lora_path.replace("{name}", name))

    def _tagged(self, fields: dict[str, Any], n: int) -> list[Any] | None:
        extra = fields.get("extra_keys")
        if extra is None:
            return None
        if not isinstance(extra, list) or len(extra) < n:
            raise NotCheckable(f"extra_keys has {len(extra) if isinstance(extra, list) else 0} entries for {n} blocks")
        lora = fields.get("lora_name")
        out: list[Any] = []
        for keys in extra[:n]:
            if keys is None:
                out.append(None)
                continue
            tagged: list[Any] = []
            for k in keys:
                if isinstance(k, str) and k == lora:
                    tagged.append(self._lora_key(k))
                elif isinstance(k, (list, tuple)) and len(k) == 2:
                    tagged.append(("mm", k[0], k[1]))
                elif isinstance(k, str):
                    tagged.append(("cache_salt", k))
                elif isinstance(k, bytes):
                    tagged.append(("prompt_embeds", k))
                else:
                    raise NotCheckable(f"unknown extra key {k!r}")
            out.append(tuple(tagged) if tagged else None)
        return out

    def digests(self, fields: dict[str, Any], prior: bytes | None) -> list[bytes]:
        mod = self._load()
        tokens, bs = fields["token_ids"], fields["block_size"]
        hashes = fields.get("block_hashes") or []
        n = len(tokens) // bs if isinstance(bs, int) and bs > 0 else 0
        if n != len(hashes):
            raise NotCheckable(f"{len(hashes)} hashes for {n} full blocks (skipped null blocks?)")
        if fields.get("lora_name") and fields.get("extra_keys") is None:
            self._lora_key(fields["lora_name"])  # not checkable without the path
        tagged = self._tagged(fields, n)
        return list(
            mod.vllm_block_hashes(
                tokens, bs, hash_algo=self.hash_algo, extra_keys_per_block=tagged, seed=self.seed, parent=prior
            )
        )

    def published(self, digests: Sequence[bytes], fields: dict[str, Any] | None = None) -> list[int]:
        """uint64 of the last 8 bytes (vLLM's default); raw digest bytes on the wire (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
        are read by our decoder as the int64 of their first 8 bytes."""
        raw = (fields or {}).get("raw_block_hashes")
        if raw and isinstance(raw[0], (bytes, bytearray)):
            return [int.from_bytes(d[:8], "big", signed=True) for d in digests]
        return [_signed_tail(d) for d in digests]

    def prompt_hashes(self, tokens: Sequence[int], page_size: int, *, salt: str | None, lora: str | None) -> list[int]:
        """What a fresh prompt's full blocks publish (for `conformance drive`)."""
        mod = self._load()
        n = len(tokens) // page_size
        path = None if lora is None else self._lora_key(lora)[2]
        tagged = mod.tagged_extra_keys(n, lora_name=lora, lora_path=path, cache_salt=salt)
        keys = tagged if any(t is not None for t in tagged) else None
        return self.published(
            mod.vllm_block_hashes(
                list(tokens), page_size, hash_algo=self.hash_algo, extra_keys_per_block=keys, seed=self.seed
            )
        )


PROFILES: dict[str, Callable[..., Profile]] = {
    "contract": lambda **_: ContractProfile(),
    "vllm-sha256": lambda **kw: VllmProfile("sha256", **kw),
    "vllm-sha256_cbor": lambda **kw: VllmProfile("sha256_cbor", **kw),
}


def get_profile(name: str, *, seed: str | None = None, lora_path: str | None = None) -> Profile:
    """The named profile, ready to use; ValueError for an unknown name, ProfileUnavailable if missing.

    seed (PYTHONHASHSEED) and lora_path (template with `{name}`) matter to the vLLM profiles only.
    """
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    prof = PROFILES[name](seed=seed, lora_path=lora_path)
    check = getattr(prof, "check_available", None)
    if check is not None:
        check()
    return prof
