"""What a JetStream consumer lets through from the stream (issue 28: the bus is not trusted).

A stored message must carry a valid signature of the bus's key (when the consumer has one:
`signing.SignKey`), parse (`messages.parse_message`), and a snapshot must match its end marker
(`stored.SnapshotAssembler`: parts claim the end's seq and epoch, their digest is the end's
Kve-Digest, which a signed end marker must carry). Anything else is skipped and reported to
`on_skip(counter, why)`: `auth_unsigned`, `auth_unknown_key`, `auth_bad_signature`,
`bad_messages`, `snapshots_refused`. `pick_snapshots` is the cold start's use of it.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from kvevents.jetstream.messages import BadMessage, MessageMeta, parse_message
from kvevents.jetstream.signing import H_DIGEST, SignKey
from kvevents.jetstream.stored import Snapshot, SnapshotAssembler, SnapshotRefused

__all__ = ["AUTH_COUNTERS", "Gate", "pick_snapshots"]

#: The counters of refused signatures, one per `signing.AuthFailure`.
AUTH_COUNTERS: tuple[str, ...] = ("auth_unsigned", "auth_unknown_key", "auth_bad_signature")


class Gate:
    """Checks one stored message at a time; `sign_key` None reads unsigned messages (insecure)."""

    def __init__(self, sign_key: SignKey | None, on_skip: Callable[[str, str], object]) -> None:
        self.sign_key = sign_key
        self.on_skip = on_skip

    def check(self, subject: str, headers: Mapping[str, str], data: bytes, sseq: int) -> MessageMeta | None:
        """The message's parsed subject and headers when it may be used, else None (reported)."""
        if self.sign_key is not None:
            why = self.sign_key.verify(subject, headers, data)
            if why is not None:
                self.on_skip(f"auth_{why}", f"stream seq {sseq} on {subject}: {why.replace('_', ' ')}")
                return None
        try:
            return parse_message(subject, headers)
        except BadMessage as exc:
            self.on_skip("bad_messages", f"stream seq {sseq}: {exc}")
            return None

    def part(self, asm: SnapshotAssembler, m: MessageMeta, data: bytes) -> None:
        asm.add_part(m.snap_id, m.part, data, (m.seq, m.epoch))

    def end(self, asm: SnapshotAssembler, m: MessageMeta, sseq: int) -> Snapshot | None:
        """The snapshot this end marker closes, when complete and matching (else None; a mismatch is reported)."""
        if self.sign_key is not None and not m.digest:
            asm.forget(m.snap_id)
            self.on_skip("snapshots_refused", f"stream seq {sseq}: a signed end marker without {H_DIGEST}")
            return None
        try:
            return asm.add_end(m.snap_id, m.parts, m.snapshot_fields(sseq), m.digest)
        except SnapshotRefused as exc:
            self.on_skip("snapshots_refused", f"stream seq {sseq}: {exc}")
            return None


def pick_snapshots(
    msgs: Sequence[tuple[str, Mapping[str, str], bytes, int]],
    on_bad: Callable[[str], object] | None = None,
    *,
    sign_key: SignKey | None = None,
    on_refused: Callable[[str, str], object] | None = None,
) -> dict[tuple[str, int], Snapshot]:
    """The newest usable snapshot per (source, rank) among stored snapshot messages (stream order):
    complete, matching its end marker and, with `sign_key`, authentic in every message.

    A message whose subject or headers cannot be used goes to `on_bad(why)`; an unauthentic one or
    a snapshot refused goes to `on_refused(counter, why)`."""

    def skip(counter: str, why: str) -> None:
        if counter == "bad_messages":
            if on_bad is not None:
                on_bad(why)
        elif on_refused is not None:
            on_refused(counter, why)

    gate = Gate(sign_key, skip)
    asm = SnapshotAssembler(keep=1 << 20)
    best: dict[tuple[str, int], Snapshot] = {}
    for subject, headers, data, sseq in msgs:
        m = gate.check(subject, headers, data, sseq)
        if m is None:
            continue
        if m.kind == "part":
            gate.part(asm, m, data)
        elif m.kind == "end":
            snap = gate.end(asm, m, sseq)
            if snap is not None:
                best[(snap.source, snap.rank)] = snap  # later in the stream = newer
    return best
