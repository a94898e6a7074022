"""`kvevents doctor`'s "published hashes recompute" check, under a hash profile: the contract's event
chain, or a vLLM 0.33 stream's (`vllm`: structure and links; `vllm-sha256` / `vllm-sha256_cbor`:
hashes too), the profiles `log inspect --verify` and `conformance stream` have.

Without `--profile` the profile is detected from the stream (kvevents.engines.detect: the first
chain head that recomputes under one) and the check says so. The page size is the one given, else
KVE/DESCRIBE's, else the events' own `block_size`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import zmq

from kvevents.engines.detect import OTHER, head_chain
from kvevents.engines.vllm_wire import decode_vllm_batch
from kvevents.errors import DecodeError
from kvevents.recordlog.format import Record
from kvevents.recordlog.verifiers import make_verifier
from kvevents.recordlog.verify_vllm import VLLM_PROFILES
from kvevents.zeromq.engine_requests import EngineRequestError
from kvevents.zeromq.engine_requests import snapshot as request_snapshot

__all__ = ["PROFILES", "detect_profile", "hash_check", "stream_page_size"]

#: `doctor --profile` values.
PROFILES: tuple[str, ...] = ("contract", *VLLM_PROFILES)
NAME = "published hashes recompute"
_HASH_CODES = ("hash-mismatch", "token-count", "block-size")
_CONTRACT_HINT = (
    "published hashes must be the event chain: SHA-256 over the parent's digest and the page's "
    "uint32-LE tokens, seeded by cache_salt only, never extra_key (schemas/README.md, Event hashes); check the "
    "page size (--page-size) and pass tenant salts with --salt"
)


def _stored(payloads: Iterable[bytes]) -> Iterable[Any]:
    for p in payloads:
        try:
            events = decode_vllm_batch(p).events
        except DecodeError:
            continue
        yield from (ev for ev in events if type(ev).__name__ == "VllmBlockStored")


def detect_profile(payloads: Iterable[bytes]) -> str | None:
    """The profile the stream's first conclusive chain head recomputes under (HASH_CHAINS names, OTHER
    for none of them), or None when no head could tell."""
    for ev in _stored(payloads):
        chain = head_chain(ev)
        if chain is not None:
            return chain
    return None


def stream_page_size(payloads: Iterable[bytes]) -> int | None:
    """The first BlockStored's block_size (KV-cache group 0), or None."""
    for ev in _stored(payloads):
        bs = ev.block_size
        if ev.group_idx in (None, 0) and isinstance(bs, int) and not isinstance(bs, bool) and bs > 0:
            return bs
    return None


def _record(kind: str, endpoint: str, seq: int | None, payload: bytes, index: int) -> Record:
    return Record(
        recv_time=0.0, source=kind, endpoint=endpoint, topic="", seq=seq, epoch=None, dp_rank=None, kind=kind,
        payload=payload, index=index,
    )  # fmt: skip


def _records(rep: Any, seen: Any, replay: str | None, timeout: float, ctx: zmq.Context) -> list[Record]:
    """The snapshot (every live block with parents first: heads make children verifiable), then the
    live batches seen, as records."""
    out: list[Record] = []
    if replay and any(c.name == "replay answers" and c.status != "fail" for c in rep.checks):
        try:
            payloads, _ = request_snapshot(replay, timeout=min(timeout, 3.0), context=ctx)
            out += [_record("snapshot", replay, None, p, i) for i, p in enumerate(payloads)]
        except EngineRequestError:
            pass
    for seq, _batch, payload in seen.batches:
        out.append(_record("live", rep.endpoint, seq, payload, len(out)))
    return out


def _choose(profile: str | None, payloads: list[bytes]) -> tuple[str, str]:
    """(profile to verify with, how it was chosen: "" given, " (detected from the stream)", or why
    the contract's is tried)."""
    if profile is not None:
        return profile, ""
    found = detect_profile(payloads)
    if found is None:
        return "contract", " (no chain head seen to detect the profile by)"
    if found == OTHER:
        return "contract", " (detected: none of contract, vllm-sha256, vllm-sha256_cbor recomputes the stream's heads)"
    return found, " (detected from the stream)"


def hash_check(
    rep: Any,
    seen: Any,
    replay: str | None,
    page_size: int | None,
    salts: list[str],
    timeout: float,
    ctx: zmq.Context,
    profile: str | None = None,
) -> None:
    """Add the check to `rep` (a DoctorReport) over the batches `seen` (and the replay's snapshot)."""
    payloads = [p for _, _, p in seen.batches]
    chosen, how = _choose(profile, payloads)
    rep.seen["profile"] = chosen
    if chosen == "contract" and page_size is None:
        page_size = stream_page_size(payloads)
        how += f"; page size {page_size} from the events' block_size" if page_size else ""
    if chosen == "contract" and page_size is None:
        rep.add(NAME, "skip", "no --page-size given (and neither describe nor a BlockStored said)")
        return
    v = make_verifier(chosen, page_size, salts)
    for rec in _records(rep, seen, replay, timeout, ctx):
        v.feed(rec)
    r = v.report
    shown = f"profile {chosen}{how}" + (
        f", page size {page_size}" if chosen == "contract" and "page size" not in how else ""
    )
    bad = [x for x in r.violations if x.code in _HASH_CODES or chosen == "vllm"]
    if bad:
        hint = (
            _CONTRACT_HINT
            if chosen == "contract"
            else (
                "vLLM's chain depends on its hash algo (--profile vllm-sha256 | vllm-sha256_cbor) and the engine's "
                "PYTHONHASHSEED (set it in doctor's environment too)"
            )
        )
        checked = f"{len(bad)} of {len(bad) + r.blocks_verified} checked blocks do not recompute"
        rep.add(NAME, "fail", f"{checked} under {shown}: {bad[0].message}", hint)
    elif chosen == "vllm":
        rep.add(NAME, "ok", f"{r.events} events well-formed and linked under {shown} (hashes not recomputed)")
    elif r.blocks_verified == 0:
        rep.add(
            NAME,
            "warn" if seen.decoded else "skip",
            f"no block could be checked under {shown} ({r.blocks_unverifiable} unverifiable: parents stored "
            "before the window)"
            if seen.decoded
            else "nothing was received to check",
            "run longer (--timeout), or give --replay so the snapshot provides chain heads",
        )
    else:
        extra = f" ({r.blocks_unverifiable} unverifiable)" if r.blocks_unverifiable else ""
        rep.add(NAME, "ok", f"{r.blocks_verified} blocks recomputed under {shown}{extra}")
