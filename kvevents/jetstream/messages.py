"""The JetStream feed's messages, typed: what its NATS side queues for its poll side, and one
stored message's subject and headers parsed with a guard.

A header that is missing where it is needed, or not what it must be (a seq, part index, part
count, stream position or epoch that is not a decimal integer in range; a kind the subject cannot
carry; a snapshot message without an id; an end marker's parts digest that is not 64 hex digits)
makes the whole message a `BadMessage`: the feed counts, logs and skips it, and never lets a ValueError out of `poll()`. The subject names the source and
dp rank; `Kve-Source` and `Kve-Rank` repeat them for people and are not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Union

from kvevents.errors import KVEventsError
from kvevents.jetstream.link import H_EPOCH, H_FROM, H_KIND, H_PART, H_PARTS, H_SEQ, H_SNAP, parse_subject
from kvevents.jetstream.signing import H_DIGEST
from kvevents.jetstream.stored import Refill, Snapshot

__all__ = [
    "BadMessage",
    "CaughtUp",
    "MessageMeta",
    "QueueItem",
    "Refilled",
    "Snapshots",
    "Stop",
    "StoredMsg",
    "parse_message",
]

_INT = re.compile(r"-?[0-9]{1,19}")  # what the bridge writes (str(int)); no signs, blanks or `_`
_I63 = 2**63 - 1
_DIGEST = re.compile(r"[0-9a-f]{64}")
MessageKind = Literal["live", "part", "end"]


class BadMessage(KVEventsError, ValueError):
    """A stored message whose subject or headers cannot be used; the text says which and why."""


# ---------------------------------------------------------------- queue items (NATS side -> poll side)


@dataclass(frozen=True, slots=True)
class StoredMsg:
    """One message read from the stream, as nats-py gave it."""

    subject: str
    headers: Mapping[str, str]
    data: bytes
    stream_seq: int
    ack: Any = None  # durable mode: the nats-py message to acknowledge once its batches are consumed


@dataclass(frozen=True, slots=True)
class Snapshots:
    """The cold start's pick: the newest complete snapshot per (source, dp_rank), read first."""

    chosen: Mapping[tuple[str, int], Snapshot]
    last_seq: int  # the stream's last seq when the feed started: synced once a message past it is handled
    synced: bool  # nothing stored to wait for (an empty stream, a durable consumer resuming, ...)
    bad: tuple[str, ...] = ()  # why stored snapshot messages were skipped (counted on the poll side)
    refused: tuple[tuple[str, str], ...] = ()  # (counter, why) of unauthentic or mismatched snapshot messages


@dataclass(frozen=True, slots=True)
class Refilled:
    """What a Refill read again: the stored live batches of one (source, rank) from its start on."""

    refill: Refill
    msgs: tuple[StoredMsg, ...]


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """Everything stored when the feed started has been delivered to it."""


@dataclass(frozen=True, slots=True)
class Stop:
    """Wakes a waiting poll: the feed is stopping."""


QueueItem = Union[StoredMsg, Snapshots, Refilled, CaughtUp, Stop]


# ---------------------------------------------------------------- one message's subject and headers


@dataclass(frozen=True, slots=True)
class MessageMeta:
    """A stored message's subject and headers, parsed: who, which seq and epoch, which snapshot part."""

    source: str
    rank: int
    kind: MessageKind  # live on a live subject; part or end on a `.snap` subject
    seq: int  # live: the engine seq; snapshot: the seq S it covers (-1: nothing published yet)
    epoch: int | None
    start: int  # Kve-From: stream seq from which the batches after S are stored (0 when absent)
    snap_id: str = ""
    part: int = 0  # a part's index
    parts: int = 0  # an end marker's part count
    digest: str = ""  # an end marker's Kve-Digest of its parts ("" when the bridge wrote none)

    def snapshot_fields(self, stream_seq: int) -> dict[str, Any]:
        """What `SnapshotAssembler.add_end` builds the Snapshot from."""
        return {
            "source": self.source,
            "rank": self.rank,
            "seq": self.seq,
            "epoch": self.epoch,
            "start": self.start,
            "stream_seq": stream_seq,
        }


def _int(headers: Mapping[str, str], name: str, low: int, *, default: int | None = None) -> int:
    text = headers.get(name)
    if text is None or text == "":
        if default is None:
            raise BadMessage(f"header {name} missing")
        return default
    if not isinstance(text, str) or not _INT.fullmatch(text):
        raise BadMessage(f"header {name} {text!r}: not a decimal integer")
    value = int(text)
    if not low <= value <= _I63:
        raise BadMessage(f"header {name} {text!r}: out of range ({low}..2**63-1)")
    return value


def parse_message(subject: str, headers: Mapping[str, str]) -> MessageMeta:
    """The parsed subject and headers of one stored message; BadMessage saying what is wrong."""
    parsed = parse_subject(subject)
    if parsed is None:
        raise BadMessage(f"subject {subject!r}: not kvevents.<stream>.<source>.<dp_rank>[.snap]")
    source, rank, is_snap = parsed
    if rank < 0:
        raise BadMessage(f"subject {subject!r}: dp rank {rank} is negative")
    kind = headers.get(H_KIND) or "live"
    epoch_text = headers.get(H_EPOCH)
    epoch = None if not epoch_text else _int(headers, H_EPOCH, 0)
    start = _int(headers, H_FROM, 0, default=0)
    if not is_snap:
        if kind != "live":
            raise BadMessage(f"header {H_KIND} {kind!r} on a live subject")
        return MessageMeta(source, rank, "live", _int(headers, H_SEQ, 0), epoch, start)
    seq = _int(headers, H_SEQ, -1)
    snap_id = headers.get(H_SNAP) or ""
    if not snap_id:
        raise BadMessage(f"header {H_SNAP} missing on a snapshot message")
    if kind == "part":
        return MessageMeta(source, rank, "part", seq, epoch, start, snap_id, part=_int(headers, H_PART, 0))
    if kind == "end":
        digest = headers.get(H_DIGEST) or ""
        if digest and not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
            raise BadMessage(f"header {H_DIGEST} {digest!r}: not 64 lowercase hex digits")
        parts = _int(headers, H_PARTS, 0)
        return MessageMeta(source, rank, "end", seq, epoch, start, snap_id, parts=parts, digest=digest)
    raise BadMessage(f"header {H_KIND} {kind!r} on a snapshot subject (part or end)")
