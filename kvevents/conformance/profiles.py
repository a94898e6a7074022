"""Hash profiles: how a published BlockStored's hashes are recomputed from its token_ids.

`contract` is this project's event chain (SGLang 0.5.20: SHA-256 over u32-LE pages, seeded by
cache_salt, published as the first 8 digest bytes). The vLLM entries call the vLLM hashing
profile in `kvevents.engines.vllm` when it is installed and report "profile not available" if not.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Protocol, Sequence

from kvevents.hashing import (
    Namespace,
    digest_chain,
    digests_to_int64,
    event_seed,
    pack_tokens,
    split_pages,
)
from kvevents.transport.wire import HASH_SCHEME

__all__ = ["Profile", "ContractProfile", "ProfileUnavailable", "PROFILES", "get_profile"]


class ProfileUnavailable(ValueError):
    """The named profile needs a module that is not installed (or lacks the expected function)."""


class Profile(Protocol):
    """Recompute one BlockStored: a chain head's prior, the page digests, their published ints."""

    name: str
    hash_scheme: str | None  # what KVE/DESCRIBE should say, if anything

    def head_prior(self, fields: dict[str, Any]) -> bytes | None: ...

    def digests(self, fields: dict[str, Any], prior: bytes | None) -> list[bytes]: ...

    def published(self, digests: Sequence[bytes]) -> list[int]: ...


class ContractProfile:
    """The contract's event chain; `fields` is the decoded event map (cache_salt seeds heads)."""

    name = "contract"
    hash_scheme: str | None = HASH_SCHEME

    def head_prior(self, fields: dict[str, Any]) -> bytes | None:
        salt = fields.get("cache_salt")
        seed = event_seed(Namespace(None, salt if isinstance(salt, str) else None))
        return bytes.fromhex(seed) if seed else None

    def digests(self, fields: dict[str, Any], prior: bytes | None) -> list[bytes]:
        pages = split_pages(pack_tokens(fields["token_ids"]), fields["block_size"])
        return digest_chain(pages, prior)

    def published(self, digests: Sequence[bytes]) -> list[int]:
        return digests_to_int64(list(digests))


def _signed_tail(d: bytes) -> int:
    """vLLM publishes the last 8 digest bytes as uint64; our decoder reads that as signed int64."""
    return int.from_bytes(d[-8:], "big", signed=True)


class VllmProfile:
    """vLLM 0.33's block-hash chain through `kvevents.engines.vllm` (imported on first use)."""

    hash_scheme: str | None = None

    def __init__(self, hash_algo: str) -> None:
        self.hash_algo = hash_algo
        self.name = f"vllm-{hash_algo}"
        self._fn: Callable[..., Any] | None = None
        self._params: set[str] = set()

    def _load(self) -> Callable[..., Any]:
        if self._fn is None:
            try:
                mod = importlib.import_module("kvevents.engines.vllm")
            except ImportError as exc:
                raise ProfileUnavailable(f"profile {self.name} not available: kvevents.engines.vllm ({exc})") from None
            fn = getattr(mod, "vllm_block_hashes", None)
            if not callable(fn):
                raise ProfileUnavailable(f"profile {self.name} not available: kvevents.engines.vllm has no vllm_block_hashes")
            self._fn = fn
            self._params = set(inspect.signature(fn).parameters)
        return self._fn

    def check_available(self) -> None:
        """Raise ProfileUnavailable now rather than on the first event."""
        self._load()

    def head_prior(self, fields: dict[str, Any]) -> bytes | None:
        return None  # the function seeds heads with NONE_HASH itself

    def digests(self, fields: dict[str, Any], prior: bytes | None) -> list[bytes]:
        fn = self._load()
        kwargs: dict[str, Any] = {"hash_algo": self.hash_algo}
        for name in ("parent", "parent_hash", "prior"):
            if name in self._params:
                kwargs[name] = prior
                break
        extra = fields.get("extra_keys")
        if extra is not None and "extra_keys" in self._params:
            kwargs["extra_keys"] = extra
        out = fn(fields["token_ids"], fields["block_size"], **kwargs)
        return [d if isinstance(d, bytes) else bytes(d) for d in out]

    def published(self, digests: Sequence[bytes]) -> list[int]:
        return [_signed_tail(d) for d in digests]


PROFILES: dict[str, Callable[[], Profile]] = {
    "contract": ContractProfile,
    "vllm-sha256": lambda: VllmProfile("sha256"),
    "vllm-sha256_cbor": lambda: VllmProfile("sha256_cbor"),
}


def get_profile(name: str) -> Profile:
    """The named profile, ready to use; ValueError for an unknown name, ProfileUnavailable if missing."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    prof = PROFILES[name]()
    check = getattr(prof, "check_available", None)
    if check is not None:
        check()
    return prof
