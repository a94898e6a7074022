"""The JetStream bus's HMAC (kvevents.jetstream.signing) and the snapshot checks that lean on it
(issue 28): what is covered, each refusal reason, key files, and the end marker's parts digest."""

from __future__ import annotations

import os
import stat

import pytest

from kvevents.jetstream.gate import pick_snapshots
from kvevents.jetstream.link import H_EPOCH, H_FROM, H_KIND, H_PART, H_PARTS, H_SEQ, H_SNAP, live_subject, snap_subject
from kvevents.jetstream.order import SnapshotAssembler, SnapshotRefused
from kvevents.jetstream.signing import H_DIGEST, H_KEY, H_SIG, SIGNED_HEADERS, SignKey, parts_digest, write_key_file

LIVE = live_subject("KV", "w0", 0)
SNAP = snap_subject("KV", "w0", 0)


def _signed(key: SignKey, subject: str = LIVE, payload: bytes = b"batch", **extra: str) -> dict[str, str]:
    return dict(key.sign(subject, {H_SEQ: "7", H_EPOCH: "42", H_KIND: "live", **extra}, payload))


def test_a_signed_message_verifies_and_every_covered_part_matters():
    key = SignKey.generate()
    h = _signed(key)
    assert key.verify(LIVE, h, b"batch") is None
    assert key.verify(LIVE, h, b"batcH") == "bad_signature"  # the payload
    assert key.verify(live_subject("KV", "w1", 0), h, b"batch") == "bad_signature"  # the subject (source)
    assert key.verify(live_subject("KV", "w0", 1), h, b"batch") == "bad_signature"  # the subject (rank)
    for name in SIGNED_HEADERS:
        changed = {**h, name: "8"} if h.get(name) != "8" else {**h, name: "9"}
        assert key.verify(LIVE, changed, b"batch") == "bad_signature", name
    assert key.verify(LIVE, {k: v for k, v in h.items() if k != H_KIND}, b"batch") == "bad_signature"
    assert key.verify(LIVE, {**h, "Kve-Source": "someone", "Nats-Msg-Id": "x"}, b"batch") is None  # not covered


def test_each_refusal_reason():
    key, other = SignKey.generate(), SignKey.generate()
    h = _signed(key)
    assert key.verify(LIVE, {H_SEQ: "7"}, b"batch") == "unsigned"
    assert key.verify(LIVE, {**h, H_SIG: ""}, b"batch") == "unsigned"
    assert other.verify(LIVE, h, b"batch") == "unknown_key"
    assert key.verify(LIVE, {**h, H_KEY: other.key_id}, b"batch") == "unknown_key"
    assert key.verify(LIVE, {**h, H_SIG: "00" * 32}, b"batch") == "bad_signature"


def test_key_files_rotation_and_errors(tmp_path):
    path = tmp_path / "bus.key"
    key = write_key_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert SignKey.from_file(path).key_id == key.key_id
    with pytest.raises(FileExistsError):
        write_key_file(path)
    new = SignKey.generate()
    rotating = tmp_path / "rotating.key"
    rotating.write_text("# new key first, the old one still verifies\n" + new.hex_lines() + key.hex_lines())
    both = SignKey.from_file(rotating)
    assert both.key_id == new.key_id
    assert both.verify(LIVE, _signed(key), b"batch") is None and both.verify(LIVE, _signed(new), b"batch") is None
    bad = {
        "missing": tmp_path / "nope.key",
        "a directory": tmp_path,
        "empty": tmp_path / "empty.key",
        "short": tmp_path / "short.key",
        "big": tmp_path / "big.key",
    }
    bad["empty"].write_text("# nothing\n")
    bad["short"].write_text("abcd\n")
    bad["big"].write_text("0" * 70000)
    for p in bad.values():
        with pytest.raises(ValueError, match="sign key"):
            SignKey.from_file(p)


def _parts(key: SignKey | None, sid: str, seq: int, payloads: list[bytes], digest: str | None = None) -> list:
    base = {H_SEQ: str(seq), H_EPOCH: "7", H_SNAP: sid, H_FROM: "3"}
    msgs = []
    for i, p in enumerate(payloads):
        h = {**base, H_KIND: "part", H_PART: str(i)}
        msgs.append((SNAP, key.sign(SNAP, h, p) if key else h, p))
    end = {**base, H_KIND: "end", H_PARTS: str(len(payloads)), H_DIGEST: digest or parts_digest(payloads)}
    msgs.append((SNAP, key.sign(SNAP, end, b"") if key else end, b""))
    return msgs


def test_cold_start_takes_the_newest_authentic_matching_snapshot():
    """Regression (issue 28): a forged snapshot stored after the genuine one was taken as the state."""
    key = SignKey.generate()
    genuine = _parts(key, "b-1", 50, [b"g0", b"g1"])
    forged = _parts(None, "x-1", 51, [b"one block"])  # unsigned, stored later
    wrong_key = _parts(SignKey.generate(), "y-1", 52, [b"other"])
    msgs = [(s, h, d, i + 1) for i, (s, h, d) in enumerate(genuine + forged + wrong_key)]
    refused: list[tuple[str, str]] = []
    got = pick_snapshots(msgs, sign_key=key, on_refused=lambda c, w: refused.append((c, w)))
    assert got[("w0", 0)].payloads == [b"g0", b"g1"] and got[("w0", 0)].seq == 50
    assert [c for c, _ in refused] == ["auth_unsigned"] * 2 + ["auth_unknown_key"] * 2
    assert pick_snapshots(msgs)[("w0", 0)].payloads == [b"other"]  # without a key: the newest wins


def test_an_end_marker_must_match_its_parts():
    key = SignKey.generate()
    good = _parts(key, "b-1", 50, [b"g0"])
    bad_digest = _parts(key, "b-2", 60, [b"g0", b"g1"], digest=parts_digest([b"g0", b"zz"]))
    msgs = [(s, h, d, i + 1) for i, (s, h, d) in enumerate(good + bad_digest)]
    refused: list[tuple[str, str]] = []
    got = pick_snapshots(msgs, sign_key=key, on_refused=lambda c, w: refused.append((c, w)))
    assert got[("w0", 0)].seq == 50 and refused[0][0] == "snapshots_refused" and "digest" in refused[0][1]
    unsigned_end = {H_SEQ: "60", H_SNAP: "s", H_KIND: "end", H_PARTS: "0"}
    refused.clear()
    pick_snapshots(
        [(SNAP, key.sign(SNAP, unsigned_end, b""), b"", 1)],
        sign_key=key,
        on_refused=lambda c, w: refused.append((c, w)),
    )
    assert refused and "Kve-Digest" in refused[0][1]


def test_assembler_refuses_a_second_different_part_and_parts_of_another_seq():
    a = SnapshotAssembler()
    a.add_part("s", 0, b"real", (5, 7))
    a.add_part("s", 0, b"forged", (5, 7))
    with pytest.raises(SnapshotRefused, match="two different parts"):
        a.add_end("s", 1, {"source": "w0", "rank": 0, "seq": 5, "epoch": 7, "start": 1, "stream_seq": 3})
    a.add_part("t", 0, b"p", (4, 7))
    with pytest.raises(SnapshotRefused, match="another seq"):
        a.add_end("t", 1, {"source": "w0", "rank": 0, "seq": 5, "epoch": 7, "start": 1, "stream_seq": 3})
    a.add_part("u", 0, b"p", (5, 7))
    a.add_part("u", 0, b"p", (5, 7))  # the same part twice (a redelivery) is fine
    snap = a.add_end("u", 1, {"source": "w0", "rank": 0, "seq": 5, "epoch": 7, "start": 1, "stream_seq": 3})
    assert snap is not None and snap.payloads == [b"p"]
