"""The two forms of a replay ROUTER's reply, as a DEALER receives them, read one reply at a time.

schemas/README.md, "Transport in one page": vLLM >= 0.26 and kvevents put the topic in every
reply, `["", topic, seq, payload]`, end marker `["", "", ff*8, last]`; SGLang <= 0.5.20 and
vLLM < 0.26 leave it out, `["", seq, payload]`, end marker `["", ff*8, last]`. `seq` is 8 bytes
(`ff*7 fe` for snapshot batches, `ff*8` for the end marker, whose `last` is empty or a snapshot's
8-byte S). A reply in neither form is None here: the request it answers has failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import msgspec

from kvevents.zeromq.wire import END_SEQ

__all__ = [
    "TOPIC_FRAMING",
    "NO_TOPIC_FRAMING",
    "FRAMINGS",
    "Reply",
    "parse_reply",
    "reply_problem",
    "framing_label",
    "describe_epoch",
]

TOPIC_FRAMING = "4-frame"
NO_TOPIC_FRAMING = "3-frame"
#: framing name -> its reply layout and who sends it (shown by tail, doctor, /workers, conformance)
FRAMINGS: dict[str, str] = {
    TOPIC_FRAMING: "['', topic, seq, payload]: vLLM >= 0.26, kvevents",
    NO_TOPIC_FRAMING: "['', seq, payload], no topic frame: SGLang <= 0.5.20, vLLM < 0.26",
}


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply message: its framing, topic (None in the 3-frame form), 8-byte seq frame, payload."""

    framing: str
    topic: bytes | None
    seq: bytes
    payload: bytes

    @property
    def is_end(self) -> bool:
        """The end marker closing a replay or a snapshot (its payload: empty, or a snapshot's S)."""
        return self.seq == END_SEQ


def reply_problem(frames: Sequence[bytes]) -> str | None:
    """Why `frames` is in neither reply form (one line), or None when it is in one."""
    n = len(frames)
    if n not in (3, 4):
        return f"{n} frames, want ['', topic, seq, payload] or ['', seq, payload]"
    if frames[0] != b"":
        return f"first frame of {len(frames[0])} bytes, want the empty delimiter"
    seq = frames[n - 2]
    if len(seq) != 8:
        return f"seq frame of {len(seq)} bytes in a {n}-frame reply, want 8"
    return None


def parse_reply(frames: Sequence[bytes]) -> Reply | None:
    """`frames` as a Reply in whichever form it has, or None when it has neither."""
    if reply_problem(frames) is not None:
        return None
    if len(frames) == 4:
        return Reply(TOPIC_FRAMING, frames[1], frames[2], frames[3])
    return Reply(NO_TOPIC_FRAMING, None, frames[1], frames[2])


def framing_label(framing: str | None) -> str:
    """`3-frame (['', seq, payload], ...: SGLang <= 0.5.20, vLLM < 0.26)`; "not seen yet" for None."""
    if framing is None:
        return "not seen yet"
    return f"{framing} ({FRAMINGS.get(framing, 'unknown')})"


def describe_epoch(payload: bytes) -> int | None:
    """The epoch of a KVE/DESCRIBE answer `["", map]` (None: the map has none); ValueError when
    `payload` is not a msgpack map or its epoch is not an integer."""
    try:
        info = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    if not isinstance(info, dict):
        raise ValueError(f"a msgpack {type(info).__name__}, not a map")
    epoch = info.get("epoch")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
        raise ValueError(f"epoch is {type(epoch).__name__}")
    return epoch
