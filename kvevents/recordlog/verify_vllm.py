"""`log inspect --verify --profile vllm[-sha256|-sha256_cbor]`: check a recorded vLLM 0.33 stream.

Per (source, dp_rank, group_idx): every event decodes with vLLM's fields; a BlockStored has
`block_size` tokens per hash (a non-full-attention group may span skipped null blocks: counted
unverifiable, not a violation), one `extra_keys` entry per hash, hashes as uint64 or bytes;
parents are live before children (full-attention groups: a sliding-window group's parent may be a
skipped block); removes only remove live copies (ref-counted per medium). With
a hash algo, every hash recomputes from token_ids with vLLM's chain (NONE_HASH for a head, the
parent's digest otherwise); the untagged extra keys are tagged back (a LoRA block needs
`lora_paths`, as vLLM hashes the adapter path, which events do not carry).

Knowledge of a source starts at seq 0 (vLLM sends no AllBlocksCleared at start) or at an
AllBlocksCleared; before that, and after a gap or reset, parent and remove checks are counted
as unchecked, as in the contract verifier.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

from kvevents.engines.vllm import PROFILES, hash_function, none_hash, to_event_hash
from kvevents.engines.vllm_wire import VllmBlockRemoved, VllmBlockStored, decode_vllm_batch
from kvevents.errors import DecodeError
from kvevents.recordlog.format import Record
from kvevents.recordlog.stats import SeqTracker
from kvevents.recordlog.verify import VerifyReport, Violation

__all__ = ["VllmVerifier", "VLLM_PROFILES"]

#: `--profile` values: "vllm" checks structure and links only; the others recompute hashes too.
VLLM_PROFILES = ("vllm", *PROFILES)
_U64 = (1 << 64) - 1


def _key(h: Any) -> int | bytes | None:
    if type(h) is int and -(1 << 63) <= h <= _U64:
        return h & _U64
    if type(h) is bytes and h:
        return h
    return None


class _Group:
    __slots__ = ("known", "copies", "any")

    def __init__(self) -> None:
        self.known = False
        self.copies: Counter = Counter()  # (medium, hash) -> live copies
        self.any: Counter = Counter()  # hash -> live copies on any medium


class VllmVerifier:
    """Feed records in log order with `feed`; read `report` (a VerifyReport) at the end."""

    def __init__(
        self,
        profile: str = "vllm",
        *,
        hash_seed: str | None = None,
        lora_paths: Mapping[str, str] | None = None,
        page_size: int | None = None,
    ) -> None:
        if profile not in VLLM_PROFILES:
            raise ValueError(f"profile must be one of {', '.join(VLLM_PROFILES)}, got {profile!r}")
        self.profile = profile
        self.algo = PROFILES.get(profile)
        self.page_size = page_size
        self.lora_paths = dict(lora_paths or {})
        self.report = VerifyReport(page_size or 0, [], page_size_given=page_size is not None)
        self._fn = hash_function(self.algo) if self.algo else None
        self._none = none_hash(self.algo, hash_seed) if self.algo else b""
        self._digests: dict[tuple[str, Any], dict[int | bytes, bytes]] = {}  # per source/rank: hash -> digest
        self._groups: dict[tuple[str, Any, Any], _Group] = {}
        self._seqs = SeqTracker()

    def _violate(self, rec: Record, ev: int | None, code: str, msg: str) -> None:
        self.report.add(Violation(rec.index, rec.source, rec.seq, ev, code, msg))

    def _forget(self, source: str, rank: Any, known: bool) -> None:
        for (s, r, _group), grp in self._groups.items():
            if s == source and (rank is None or r == rank):
                grp.known = known
                grp.copies.clear()
                grp.any.clear()
        for s, r in list(self._digests):
            if s == source and (rank is None or r == rank):
                del self._digests[(s, r)]

    def feed(self, rec: Record) -> None:
        rep = self.report
        rep.records += 1
        if rec.kind == "reset":
            self._seqs.reset(rec.source, rec.dp_rank)
            self._forget(rec.source, rec.dp_rank, False)
            return
        try:
            batch = decode_vllm_batch(rec.payload)
        except DecodeError as exc:
            self._violate(rec, None, "decode", str(exc))
            return
        rank = batch.data_parallel_rank if batch.data_parallel_rank is not None else rec.dp_rank
        if rec.kind in ("live", "replay") and rec.seq is not None:
            first = not any(s == rec.source and r == rank for s, r, _ in self._groups)
            if self._seqs.observe(rec.source, rank, rec.seq, rec.epoch) is not None:
                self._forget(rec.source, rank, False)
            elif first and rec.seq == 0:
                self._group(rec.source, rank, None).known = True
        for i, ev in enumerate(batch.events):
            rep.events += 1
            if isinstance(ev, VllmBlockStored):
                self._stored(rec, i, ev, rank)
            elif isinstance(ev, VllmBlockRemoved):
                self._removed(rec, i, ev, rank)
            else:
                self._forget(rec.source, rank, True)

    def _group(self, source: str, rank: Any, group: Any) -> _Group:
        key = (source, rank, group if isinstance(group, int) else 0)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group()
            g.known = any(v.known for (s, r, _), v in self._groups.items() if s == source and r == rank and v is not g)
        return g

    def _removed(self, rec: Record, i: int, ev: VllmBlockRemoved, rank: Any) -> None:
        g = self._group(rec.source, rank, ev.group_idx)
        for h in ev.block_hashes:
            k = _key(h)
            if k is None:
                self._violate(rec, i, "bad-hash", f"BlockRemoved hash {h!r} is neither a uint64 nor digest bytes")
                continue
            n = g.copies.get((ev.medium, k), 0)
            if n > 0:
                g.copies[(ev.medium, k)] = n - 1
                g.any[k] -= 1
                if g.any[k] <= 0:
                    del g.any[k]
                    self._drop_digest(rec.source, rank, k)
            elif g.known:
                self._violate(
                    rec,
                    i,
                    "remove-not-live",
                    f"BlockRemoved of {h!r} (group {ev.group_idx}) but no live copy on {ev.medium}",
                )
            else:
                self.report.removes_unchecked += 1

    def _drop_digest(self, source: str, rank: Any, k: int | bytes) -> None:
        """Digests are kept while some group of the source holds the hash: memory follows the live set."""
        if not any(s == source and r == rank and k in g.any for (s, r, _), g in self._groups.items()):
            self._digests.get((source, rank), {}).pop(k, None)

    def _stored(self, rec: Record, i: int, ev: VllmBlockStored, rank: Any) -> None:
        rep = self.report
        g = self._group(rec.source, rank, ev.group_idx)
        keys = [_key(h) for h in ev.block_hashes]
        if not keys or None in keys:
            self._violate(rec, i, "bad-hash", "BlockStored has no hashes or a hash that is neither a uint64 nor bytes")
            return
        n, bs, tokens = len(keys), ev.block_size, ev.token_ids
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1 or not isinstance(tokens, list):
            self._violate(rec, i, "structure", f"block_size {bs!r} / token_ids {type(tokens).__name__}")
            return
        if self.page_size and bs != self.page_size:
            self._violate(rec, i, "block-size", f"block_size {bs} but --page-size is {self.page_size}")
        rep.saw_block_size(bs)  # the stream's block size is reported when --page-size was not given
        spans_nulls = (
            len(tokens) > n * bs and len(tokens) % bs == 0 and ev.kv_cache_spec_kind not in (None, "full_attention")
        )
        if len(tokens) != n * bs and not spans_nulls:
            self._violate(rec, i, "token-count", f"{len(tokens)} token ids for {n} blocks of {bs}")
            rep.blocks_unverifiable += n
            return
        extras = ev.extra_keys
        if extras is not None and (not isinstance(extras, list) or len(extras) != n):
            self._violate(rec, i, "extra-keys", f"extra_keys must hold one entry per hash ({n})")
            return
        parent = _key(ev.parent_block_hash) if ev.parent_block_hash is not None else None
        if ev.parent_block_hash is not None:
            if parent is None:
                self._violate(rec, i, "bad-hash", f"parent_block_hash {ev.parent_block_hash!r} is not a hash")
            elif g.any.get(parent, 0) <= 0:
                if g.known and ev.kv_cache_spec_kind in (None, "full_attention"):  # other groups skip null blocks
                    self._violate(
                        rec,
                        i,
                        "parent-missing",
                        f"parent {ev.parent_block_hash!r} (group {ev.group_idx}) has no live copy",
                    )
                else:
                    rep.parents_unchecked += 1
        for k in keys:
            g.copies[(ev.medium, k)] += 1
            g.any[k] += 1
        if self._fn is None:
            return
        if spans_nulls:
            rep.blocks_unverifiable += n
            return
        self._check_hashes(rec, i, ev, keys, parent, rank)

    def _tagged(self, block: Any, lora: str | None, head: bool) -> tuple[Any, ...] | None:
        """One block's untagged event keys tagged back as vLLM 0.33 hashes them; ValueError if it cannot."""
        if block is None:
            return None
        out: list[Any] = []
        for k in block:
            if isinstance(k, str) and k == lora:
                if lora not in self.lora_paths:
                    raise ValueError(f"LoRA {lora!r} hashes its adapter path: pass --lora-path {lora}=PATH")
                out.append(("lora", lora, self.lora_paths[lora]))
            elif isinstance(k, str) and head:
                out.append(("cache_salt", k))
            elif isinstance(k, list) and len(k) == 2:
                out.append(("mm", k[0], k[1]))
            elif isinstance(k, bytes):
                out.append(("prompt_embeds", k))
            else:
                raise ValueError(f"extra key {k!r} cannot be tagged back")
        return tuple(out) if out else None

    def _check_hashes(self, rec: Record, i: int, ev: VllmBlockStored, keys: list[Any], parent: Any, rank: Any) -> None:
        rep, fn = self.report, self._fn
        assert fn is not None
        digests = self._digests.setdefault((rec.source, rank), {})
        if parent is None:
            prior = self._none
            rep.heads["none_hash"] += 1
        else:
            prior = digests.get(parent)  # type: ignore[assignment]
            if prior is None:
                rep.blocks_unverifiable += len(keys)
                return
        bs, tokens, extras = ev.block_size, ev.token_ids, ev.extra_keys
        for k, h in enumerate(keys):
            try:
                tagged = self._tagged(
                    extras[k] if extras is not None else None, ev.lora_name, parent is None and k == 0
                )
            except ValueError as exc:
                if "LoRA" not in str(exc):
                    self._violate(rec, i, "extra-keys", str(exc))
                rep.blocks_unverifiable += len(keys) - k
                return
            digest = fn((prior, tuple(tokens[k * bs : (k + 1) * bs]), tagged))
            want = digest if isinstance(h, bytes) else to_event_hash(digest)
            if want != h:
                self._violate(
                    rec,
                    i,
                    "hash-mismatch",
                    f"block {k} published {h!r} but vLLM's {self.algo} chain gives {want!r} "
                    "(another hash algo, PYTHONHASHSEED, or an older vLLM's extra keys?)",
                )
                rep.blocks_unverifiable += len(keys) - k - 1
                return
            digests[h] = digest
            prior = digest
            rep.blocks_verified += 1


def parse_lora_paths(specs: Iterable[str]) -> dict[str, str]:
    """`NAME=PATH` pairs -> {name: path} (ValueError on a malformed one)."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--lora-path {spec!r}: expected NAME=PATH")
        out[name] = path
    return out
