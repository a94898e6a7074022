"""What each source publishes, learned from its own stream, and how it compares with what a consumer
was told: the page size (its first BlockStored's `block_size`), the hash chain (its first chain head
recomputed: kvevents.engines.detect), the replay framing (the feed's `SourceStatus.replay_framing`).

`PublishedWatch` sits in a feed (the ZeroMQ Subscriber, the JetStream feed) and fills those fields
of its `SourceStatus`. `SourceNotes` turns statuses into the one-line notes a command prints per
source: what it publishes once learned, a disagreement with the consumer's page size or key mode
(a router that would otherwise index nothing, silently), and the likely misconfiguration its
sockets saw (`SourceStatus.problem`); each said once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvevents.engines.detect import OTHER, head_chain
from kvevents.errors import DecodeError
from kvevents.feed import Delivery, SourceStatus

__all__ = ["PublishedWatch", "SourceNotes", "mismatch", "summary"]

UNDECIDED_AFTER = 256  # stored events without a conclusive chain head: the chain is called "other"


class PublishedWatch:
    """Per source: the page size and hash chain of its first stored blocks. `observe_all` on the
    feed's thread costs a set lookup per delivery once a source is learned; `fill` from any thread."""

    def __init__(self, undecided_after: int = UNDECIDED_AFTER) -> None:
        self.undecided_after = undecided_after
        self._page: dict[str, int] = {}
        self._chain: dict[str, str] = {}
        self._stores: dict[str, int] = {}
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def observe_all(self, items: Iterable[Any]) -> None:
        """Learn from every Delivery of a source not learned yet (Resets and learned sources pass)."""
        done = self._done
        for it in items:
            if it.__class__ is Delivery and it.source not in done:
                self._observe(it)

    def _events(self, d: Delivery) -> list[Any]:
        """The batch's events with every engine field (vLLM's `extra_keys`, `group_idx`) when the raw
        payload is at hand, else as decoded."""
        if d.payload:
            from kvevents.engines.vllm_wire import decode_vllm_batch

            try:
                return list(decode_vllm_batch(d.payload).events)
            except DecodeError:
                pass
        return list(d.batch.events)

    def _observe(self, d: Delivery) -> None:
        src = d.source
        for ev in self._events(d):
            if type(ev).__name__ not in ("BlockStored", "VllmBlockStored"):
                continue
            if getattr(ev, "group_idx", None) not in (None, 0):
                continue  # another KV-cache group (vLLM hybrid models): its own block size
            with self._lock:
                bs = ev.block_size
                if src not in self._page and isinstance(bs, int) and not isinstance(bs, bool) and bs > 0:
                    self._page[src] = bs
                if src not in self._chain:
                    n = self._stores[src] = self._stores.get(src, 0) + 1
                    chain = head_chain(ev)
                    if chain is None and n >= self.undecided_after:
                        chain = OTHER
                    if chain is not None:
                        self._chain[src] = chain
                if src in self._page and src in self._chain:
                    self._done.add(src)
                    return

    def page_size(self, source: str) -> int | None:
        return self._page.get(source)

    def hash_chain(self, source: str) -> str | None:
        return self._chain.get(source)

    def fill(self, status: SourceStatus) -> SourceStatus:
        """Set the status's page_size and hash_chain from what was learned of its source; returns it."""
        status.page_size = self._page.get(status.name)
        status.hash_chain = self._chain.get(status.name)
        return status


_CHAIN_WORDS = {
    "contract": "contract hashes",
    "vllm-sha256": "vLLM sha256 hashes",
    "vllm-sha256_cbor": "vLLM sha256_cbor hashes",
    OTHER: "hashes of its own (not the contract's chain)",
}


def summary(st: SourceStatus) -> str:
    """What a source publishes, as far as known: "16-token pages, contract hashes, 4-frame replay"."""
    parts = [f"{st.page_size}-token pages" if st.page_size else "page size not seen yet"]
    if st.hash_chain:
        parts.append(_CHAIN_WORDS.get(st.hash_chain, st.hash_chain))
    if st.replay_framing:
        parts.append(f"replay framing {st.replay_framing}")
    return ", ".join(parts)


def mismatch(st: SourceStatus, page_size: int | None = None, key_mode: str | None = None) -> str | None:
    """Why what a source publishes cannot work with the consumer's page size or key mode (one line,
    naming the flag to change), or None."""
    if page_size is not None and st.page_size is not None and st.page_size != page_size:
        return (
            f"publishes {st.page_size}-token pages but --page-size is {page_size}: none of its blocks "
            f"can be indexed or matched (give --page-size {st.page_size})"
        )
    if key_mode == "contract" and st.hash_chain not in (None, "contract"):
        return (
            f"publishes {_CHAIN_WORDS.get(st.hash_chain, st.hash_chain)} but its key mode is contract: no request "
            "can match them (--key-mode NAME=tokens or auto)"
        )
    return None


class SourceNotes:
    """The per-source lines a long-running command prints (each once; a problem again once it cleared).

    `page_size`: the consumer's (None: it has none); `key_mode(name)`: the mode a source is keyed in
    now (contract | tokens | auto), for a router.
    """

    def __init__(self, page_size: int | None = None, key_mode: Callable[[str], str] | None = None) -> None:
        self.page_size = page_size
        self.key_mode = key_mode
        self._said: dict[str, set[str]] = {}
        self._problem: dict[str, str | None] = {}

    def lines(self, statuses: Mapping[str, SourceStatus]) -> list[str]:
        """New lines since the last call, each "NAME: ..."."""
        out: list[str] = []
        for name, st in statuses.items():
            said = self._said.setdefault(name, set())
            mode = self.key_mode(name) if self.key_mode is not None else None
            bad = mismatch(st, self.page_size, mode)
            if bad is not None and bad not in said:
                said.add(bad)
                out.append(f"{name}: {bad}")
            learned = st.page_size is not None and st.hash_chain is not None and mode != "auto"
            if learned and "summary" not in said and bad is None:
                said.add("summary")
                keyed = f"; keyed as {mode}" if mode is not None else ""
                out.append(f"{name}: publishes {summary(st)}{keyed}")
            if st.problem != self._problem.get(name):
                self._problem[name] = st.problem
                if st.problem is not None:
                    out.append(f"{name}: {st.problem}")
        return out
