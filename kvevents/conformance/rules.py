"""The stream rules as a pure state machine: feed it live messages and replies, get verdicts.

No sockets here (stream.py does the I/O), so tests can drive it message by message. Blocks are
counted per (medium, hash). A reference the window cannot judge (a parent or a removed block
that may have been stored before the first batch seen) is "not checkable", never a failure;
knowledge is complete from seq 0, or from an AllBlocksCleared, until a gap is left unhealed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from kvevents.conformance import probes, shape
from kvevents.conformance.profiles import NotCheckable, Profile
from kvevents.conformance.report import Report, RuleResult, Status
from kvevents.conformance.tally import Tally
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvevents.hashing import Namespace, storage_hashes, to_int64
from kvevents.zeromq.framing import framing_label, parse_reply, reply_problem
from kvevents.zeromq.wire import unpack_seq

__all__ = ["RULES", "StreamChecker"]

RULES = {
    "live-frames": "live messages are [topic, 8-byte big-endian seq, payload], one topic",
    "batch-shape": "every batch is exactly [ts float64, events (maps), dp_rank]",
    "seq-increasing": "live seqs strictly increase",
    "gaps-healed": "every seq gap is filled by replay",
    "replay-protocol": "replay replies in one framing (with or without topic), 8-byte seq from start on, "
    "bytes as live, end marker",
    "hash-recompute": "every published hash recomputes from its token_ids under the profile",
    "parents-first": "a BlockStored's parent is live when the child is stored",
    "removes-live": "BlockRemoved names only live copies",
    "all-cleared": "after AllBlocksCleared no earlier block is referenced",
    "describe": "KVE/DESCRIBE answers one consistent map",
    "snapshot": "KVE/SNAPSHOT rebuilds exactly the live blocks at its seq",
}
KEEP_PAYLOADS = 20000  # live payloads kept to compare replayed bytes with (vLLM's ring holds 10000)


class StreamChecker:
    """Judges one publisher's stream (one endpoint) message by message; `report()` at the end."""

    def __init__(self, profile: Profile, page_size: int | None = None, *, allow_epoch: bool = False) -> None:
        self.profile = profile
        self.page_size = page_size
        self.allow_epoch = allow_epoch
        self.t: dict[str, Tally] = {name: Tally() for name in RULES}
        self.expected: int | None = None  # next seq to apply
        self.last_live: int | None = None
        self.topic: bytes | None = None
        self.rank: Any = None
        self.complete = False  # every batch since seq 0 / the last AllBlocksCleared was applied
        self.live: dict[tuple[Any, int], int] = {}
        self.digests: dict[int, bytes] = {}  # published int -> full digest (recomputed and matched)
        self.cleared: dict[int, int] = {}  # hash live before an AllBlocksCleared -> that clear's seq
        self.pending: dict[int, list[tuple[int, bool]]] = {}  # missing parent -> [(child seq, complete then)]
        self.live_payloads: dict[int, bytes] = {}
        self.batches = self.events = self.pages = 0
        self.replay_offered = False  # set by the observer when it has a replay endpoint
        self.replay_framing: str | None = None  # of the first replay reply (zeromq.framing)
        self._gap_reported: int | None = None
        self._copies: dict[int, int] = {}  # live copies per hash, over all media
        self._media: set[Any] = set()
        self.snapshot_copies: Counter[tuple[Any, int]] = Counter()  # the last KVE/SNAPSHOT
        self.listeners: list[Callable[[int, KVEventBatch], None]] = []  # called with each applied batch

    # ------------------------------------------------------------------ live
    def live_seq(self, frames: list[bytes]) -> int | None:
        """The seq of a live message (None if its frames are unusable; that is a live-frames failure)."""
        problem = shape.live_frames_problem(frames)
        return None if problem else unpack_seq(frames[1])

    def on_live(self, frames: list[bytes]) -> None:
        """One live message, after any gap before it was offered to `on_replay`."""
        t = self.t["live-frames"]
        problem = shape.live_frames_problem(frames)
        if problem:
            return t.fail(problem)
        topic, seq = frames[0], unpack_seq(frames[1])
        if self.topic is None:
            self.topic = topic
        if topic != self.topic:
            return t.fail(f"seq {seq}: topic {topic!r}, earlier {self.topic!r}")
        t.ok()
        if self.last_live is not None:
            if seq <= self.last_live:
                self.t["seq-increasing"].fail(f"seq {seq} after {self.last_live} (not increasing; a restart?)")
                self._restart()  # judge what follows as a new stream, from an unknown state
            else:
                self.t["seq-increasing"].ok()
        self.last_live = seq
        self.live_payloads[seq] = frames[2]
        if len(self.live_payloads) > 2 * KEEP_PAYLOADS:  # replies are compared with the recent ones only
            for old in list(self.live_payloads)[:KEEP_PAYLOADS]:
                del self.live_payloads[old]
        if self.expected is not None and seq > self.expected:
            if self._gap_reported != seq:  # on_replay already said why it could not heal this one
                why = "not replayed" if self.replay_offered else "no replay endpoint to heal them"
                self.t["gaps-healed"].fail(f"seqs {self.expected}..{seq - 1} missing, {why}")
            self.complete = False
        if self.expected is None:
            self.complete = seq == 0
        if self.expected is None or seq >= self.expected:
            self._apply(seq, frames[2], "live")

    def _restart(self) -> None:
        """The seq went backwards: forget the old stream's state (a new process starts empty)."""
        self.expected = None
        self.live.clear()
        self._copies.clear()
        self.cleared = {}
        self.pending = {}
        self.live_payloads = {}

    # ------------------------------------------------------------------ replay
    def on_replay(self, start: int, replies: list[list[bytes]], ended: bool, *, upto: int | None, heal: bool) -> None:
        """A replay exchange: requested from `start`; its batches below `upto` fill a gap.

        `heal` False is the first contact or a probe (a start older than the ring is fine there).
        """
        t = self.t["replay-protocol"]
        if not replies and not ended:
            return t.fail(f"replay from {start}: no reply")
        good = self._judge_replies(start, replies)
        if not ended:
            t.fail(f"replay from {start}: no end marker ['', ff*8, ''] after {len(replies)} replies")
        else:
            t.ok()
        if upto is not None:
            self._fill_gap(start, good, upto, heal)

    def _judge_replies(self, start: int, replies: list[list[bytes]]) -> list[tuple[int, bytes]]:
        """Judge each reply up to the end marker (frames, seq, topic, order, bytes); returns the
        (seq, payload) of the good ones."""
        t = self.t["replay-protocol"]
        prev: int | None = None
        good: list[tuple[int, bytes]] = []
        for i, fr in enumerate(replies):
            r = parse_reply(fr)
            if r is not None and not self._same_framing(start, i, r.framing):
                continue
            if shape.is_end_marker(fr):
                break
            if r is None:
                t.fail(f"replay from {start}: reply {i}: {reply_problem(fr)}")
                continue
            topic, seq, payload = r.topic, unpack_seq(r.seq), r.payload
            if topic is not None and self.topic is not None and topic != self.topic:
                t.fail(f"replay from {start}: seq {seq} topic {topic!r}, live topic {self.topic!r}")
            elif seq < start:
                t.fail(f"replay from {start}: sent seq {seq}, older than asked")
            elif prev is not None and seq != prev + 1:
                t.fail(f"replay from {start}: seq {seq} after {prev} (want consecutive)")
            elif seq in self.live_payloads and self.live_payloads[seq] != payload:
                t.fail(f"replay from {start}: seq {seq} bytes differ from the live batch")
            else:
                t.ok()
                good.append((seq, payload))
            prev = seq
        return good

    def _fill_gap(self, start: int, good: list[tuple[int, bytes]], upto: int, heal: bool) -> None:
        """Apply the replayed batches below `upto`; with `heal`, judge whether they closed the gap."""
        for seq, payload in good:
            if seq >= upto:
                break
            if self.expected is None:
                self.complete = seq == 0
            elif seq > self.expected:
                if heal:
                    self.t["gaps-healed"].fail(
                        f"replay from {start} began at seq {seq}: {self.expected}..{seq - 1} lost"
                    )
                    self._gap_reported = upto
                self.complete = False
            if self.expected is None or seq >= self.expected:
                self._apply(seq, payload, "replay")
        if self.expected is not None and self.expected < upto and heal:
            self.t["gaps-healed"].fail(f"replay from {start} ended before seq {upto}: {self.expected}..{upto - 1} lost")
            self._gap_reported = upto
        elif heal:
            self.t["gaps-healed"].ok()

    def _same_framing(self, start: int, i: int, framing: str) -> bool:
        """Every reply of the publisher in the framing of its first (either is right; a mix is not)."""
        t = self.t["replay-protocol"]
        if self.replay_framing is None:
            self.replay_framing = framing
            t.seen = f"framing {framing_label(framing)}"
        if framing == self.replay_framing:
            return True
        t.fail(f"replay from {start}: reply {i} in the {framing} framing, earlier replies {self.replay_framing}")
        return False

    # ------------------------------------------------------------------ applying a batch
    def _apply(self, seq: int, payload: bytes, how: str) -> None:
        self.expected = seq + 1
        self.batches += 1
        problem, raw, batch = shape.inspect_batch(payload, allow_epoch=self.allow_epoch)
        if problem:
            self.t["batch-shape"].fail(f"seq {seq} ({how}): {problem}")
        else:
            self.t["batch-shape"].ok()
        if batch is None:
            return
        if self.rank is None:
            self.rank = batch.data_parallel_rank
        for listener in self.listeners:
            listener(seq, batch)
        raws = shape.raw_events(raw)
        for i, ev in enumerate(batch.events):
            self.events += 1
            fields = raws[i] if i < len(raws) else {}
            if isinstance(ev, BlockStored):
                self._stored(seq, ev, fields)
            elif isinstance(ev, BlockRemoved):
                self._removed(seq, ev)
            elif isinstance(ev, AllBlocksCleared):
                self.cleared = {h: seq for (_, h), n in self.live.items() if n > 0}
                self.live.clear()
                self._copies.clear()
                self.complete = True
                self.t["all-cleared"].ok()
                for parent, children in self.pending.items():  # still missing when everything went
                    for cseq, _ in children:
                        self.t["parents-first"].fail(f"seq {cseq}: parent {parent} was never stored before it")
                self.pending.clear()

    def _stored(self, seq: int, ev: BlockStored, fields: dict[str, Any]) -> None:
        self.pages += len(ev.block_hashes)
        if self.page_size is not None and ev.block_size != self.page_size:
            self.t["hash-recompute"].fail(
                f"seq {seq}: block_size {ev.block_size}, expected --page-size {self.page_size}"
            )
        self._parent(seq, ev.parent_block_hash)
        self._media.add(ev.medium)
        live, copies, m = self.live, self._copies, ev.medium
        for h in ev.block_hashes:
            live[(m, h)] = live.get((m, h), 0) + 1
            copies[h] = copies.get(h, 0) + 1
            if self.cleared:
                self.cleared.pop(h, None)
            for cseq, was_complete in self.pending.pop(h, []) if self.pending else ():
                msg = f"seq {cseq}: a child of {h}, which was stored only at seq {seq}"
                if was_complete:
                    self.t["parents-first"].fail(msg)
                else:
                    self.t["parents-first"].unknown += 1
        self._recompute(seq, ev, fields)

    def _parent(self, seq: int, parent: int | None) -> None:
        t = self.t["parents-first"]
        if parent is None:
            return
        if self._copies.get(parent, 0) > 0:
            return t.ok()
        if parent in self.cleared:
            self.t["all-cleared"].fail(
                f"seq {seq}: parent {parent} was cleared by AllBlocksCleared at seq {self.cleared[parent]}"
            )
            return
        self.pending.setdefault(parent, []).append((seq, self.complete))

    def _removed(self, seq: int, ev: BlockRemoved) -> None:
        t = self.t["removes-live"]
        for h in ev.block_hashes:
            keys = [(ev.medium, h)] if ev.medium is not None else [(m, h) for m in self._media]
            key = next((k for k in keys if self.live.get(k, 0) > 0), None)
            if key is not None:
                n = self.live[key] - 1
                if n:
                    self.live[key] = n
                else:
                    del self.live[key]
                n = self._copies[h] - 1
                if n:
                    self._copies[h] = n
                else:
                    del self._copies[h]
                t.ok()
            elif h in self.cleared:
                self.t["all-cleared"].fail(
                    f"seq {seq}: removes {h}, cleared by AllBlocksCleared at seq {self.cleared[h]}"
                )
            elif self.complete:
                t.fail(f"seq {seq}: removes {h} on {ev.medium}, which is not live (never stored, or already removed)")
            else:
                t.unknown += 1

    def _recompute(self, seq: int, ev: BlockStored, fields: dict[str, Any]) -> None:
        t = self.t["hash-recompute"]
        if ev.parent_block_hash is None:
            prior = self.profile.head_prior(fields)
        else:
            prior = self.digests.get(ev.parent_block_hash)
            if prior is None:
                t.unknown += 1
                return
        fields = {
            **fields,
            "token_ids": ev.token_ids,
            "block_size": ev.block_size,
            "block_hashes": ev.block_hashes,
            "raw_block_hashes": fields.get("block_hashes"),
        }
        try:
            digests = self.profile.digests(fields, prior)
            want = self.profile.published(digests, fields)
        except NotCheckable as exc:
            t.unknown += 1
            t.note = str(exc)
            return
        except ValueError as exc:
            return t.fail(f"seq {seq}: cannot hash its token_ids: {exc}")
        got = ev.block_hashes
        for page, (g, w) in enumerate(zip(got, want)):
            if g != w:
                return t.fail(f"seq {seq}: page {page} published {g}, recomputes to {w}{self._hint(ev)}")
        if len(got) != len(want):
            return t.fail(f"seq {seq}: {len(got)} hashes for {len(want)} pages of token_ids")
        t.ok()
        for h, d in zip(got, digests):
            self.digests[h] = d

    def _hint(self, ev: BlockStored) -> str:
        """Say so when a contract head's hashes are the storage chain (extra_key mixed in)."""
        if self.profile.name != "contract" or ev.parent_block_hash is not None or not ev.lora_name:
            return ""
        try:
            st = storage_hashes(ev.token_ids, ev.block_size, Namespace(ev.lora_name, ev.cache_salt))
        except ValueError:
            return ""
        if st and to_int64(st[0]) == ev.block_hashes[0]:
            return " (it is the storage hash of extra_key=lora_name: extra_key must not seed published hashes)"
        return ""

    # ------------------------------------------------------------------ describe / snapshot (probes.py)
    def on_describe(self, reply: list[bytes] | None) -> None:
        probes.judge_describe(self, reply)

    def on_snapshot(self, replies: list[list[bytes]] | None, ended: bool) -> int | None:
        """Shape-check a snapshot reply; returns S (the seq it reflects) to compare at, or None."""
        return probes.judge_snapshot(self, replies, ended)

    def compare_snapshot(self, s: int) -> None:
        """After applying every batch <= S: the snapshot's blocks must equal the live ones."""
        probes.compare_snapshot(self, s)

    # ------------------------------------------------------------------ verdicts
    def report(self) -> Report:
        for parent, children in self.pending.items():
            for cseq, was_complete in children:
                if was_complete and self.complete:
                    self.t["parents-first"].fail(f"seq {cseq}: parent {parent} never stored")
                else:
                    self.t["parents-first"].unknown += 1
        self.pending.clear()
        out = []
        for name, t in self.t.items():
            if t.failed:
                status, detail = Status.FAIL, f"{t.failed} of {t.checked} failed; first: {t.examples[0]}"
            elif not t.offered:
                status, detail = Status.NOT_OFFERED, t.note or "not offered"
            elif t.checked or (name == "gaps-healed" and self.batches):
                status = Status.PASS
                detail = (f"{t.checked} checked" if t.checked else f"no gaps in {self.batches} batches") + (
                    f", {t.unknown} not checkable" if t.unknown else ""
                )
                detail += f"; {t.seen}" if t.seen else ""
            else:
                status = Status.NOT_CHECKABLE
                detail = t.note or (f"{t.unknown} references before the window" if t.unknown else "nothing to check")
            out.append(RuleResult(name, status, detail, t.checked, list(t.examples)))
        rep = Report("conformance stream", out)
        rep.figures = {"batches": self.batches, "events": self.events, "pages": self.pages, "complete": self.complete}
        if self.replay_framing is not None:
            rep.figures["replay_framing"] = self.replay_framing
        return rep
