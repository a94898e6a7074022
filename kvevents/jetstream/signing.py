"""Message authenticity on the JetStream bus: an HMAC-SHA256 over a message's subject, the headers
that matter and its payload, with a key file the bridges and consumers share (`--sign-key FILE`).

A key file holds one key per line, 64 hex digits (32 bytes; `#` comments and blank lines allowed):
the first key signs, every key verifies, so a key is rotated by adding the new one second
everywhere, then moving it first. `Kve-Key` names the signing key (16 hex digits of a SHA-256 of
it), `Kve-Sig` carries the HMAC in hex. `SignKey.verify` says why a message is refused:
`unsigned`, `unknown_key` or `bad_signature` (the feed counts each as `auth_<reason>`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from typing import Literal, Mapping, MutableMapping, Sequence

from kvevents.jetstream.link import H_EPOCH, H_FROM, H_KIND, H_PART, H_PARTS, H_SEQ, H_SNAP

__all__ = [
    "H_DIGEST",
    "H_KEY",
    "H_SIG",
    "SIGNED_HEADERS",
    "AuthFailure",
    "SignKey",
    "parts_digest",
    "write_key_file",
]

H_SIG = "Kve-Sig"  # HMAC-SHA256 (hex) of the subject, SIGNED_HEADERS and the payload
H_KEY = "Kve-Key"  # which key signed: 16 hex digits of SHA-256("kvevents-sign-key" + key)
H_DIGEST = "Kve-Digest"  # on a snapshot's end marker: `parts_digest` of its parts, in order
#: The headers whose values the HMAC covers (an absent header counts as empty, as the parser reads it).
SIGNED_HEADERS: tuple[str, ...] = (H_SEQ, H_EPOCH, H_KIND, H_SNAP, H_PART, H_PARTS, H_FROM, H_DIGEST)
AuthFailure = Literal["unsigned", "unknown_key", "bad_signature"]

_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_MAX_FILE = 64 * 1024
_TAG = b"kvevents-jetstream-sig-1"


def _key_id(key: bytes) -> str:
    return hashlib.sha256(b"kvevents-sign-key" + key).hexdigest()[:16]


def parts_digest(payloads: Sequence[bytes]) -> str:
    """SHA-256 (hex) over the snapshot's parts in order: the end marker says which parts it closes."""
    h = hashlib.sha256(b"%d;" % len(payloads))
    for p in payloads:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()


class SignKey:
    """The shared HMAC keys of a bus: `sign` adds Kve-Key and Kve-Sig; `verify` checks them."""

    def __init__(self, keys: Sequence[bytes], source: str = "") -> None:
        if not keys:
            raise ValueError(f"sign key {source!r}: no key in it (one line of 64 hex digits)")
        for k in keys:
            if len(k) < 32:
                raise ValueError("a sign key must be at least 32 bytes")
        self._keys = {_key_id(k): k for k in keys}
        self._macs = {i: hmac.new(k, _TAG, hashlib.sha256) for i, k in self._keys.items()}  # copied per message
        self.key_id = _key_id(keys[0])
        self.source = source

    @classmethod
    def generate(cls) -> SignKey:
        return cls([secrets.token_bytes(32)])

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> SignKey:
        """The keys of a key file; ValueError saying what is wrong with it (missing, not a file, too big, malformed)."""
        name = os.fspath(path)
        try:
            st = os.stat(name)
        except OSError as exc:
            raise ValueError(f"sign key {name!r}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"sign key {name!r}: not a regular file")
        if st.st_size > _MAX_FILE:
            raise ValueError(f"sign key {name!r}: {st.st_size} bytes, a key file is a few lines")
        try:
            with open(name, encoding="ascii") as f:
                text = f.read(_MAX_FILE)
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"sign key {name!r}: cannot be read ({exc})") from None
        keys = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if not _HEX_KEY.fullmatch(line):
                raise ValueError(f"sign key {name!r} line {n}: expected 64 hex digits (`kvevents keys sign-key FILE`)")
            keys.append(bytes.fromhex(line))
        if not keys:
            raise ValueError(f"sign key {name!r}: no key in it (`kvevents keys sign-key FILE` makes one)")
        return cls(keys, name)

    def hex_lines(self) -> str:
        """The key file's text (the signing key first)."""
        first = self._keys[self.key_id]
        rest = [k for i, k in self._keys.items() if i != self.key_id]
        return "".join(k.hex() + "\n" for k in [first, *rest])

    def _mac(self, key_id: str, subject: str, headers: Mapping[str, str], payload: bytes) -> str:
        # every field length-prefixed (characters for the text, bytes for the payload): no two
        # different messages encode alike. A copy of the keyed HMAC costs a third of a new one.
        text = "".join([f"{len(v)}:{v}" for v in (subject, *[headers.get(n) or "" for n in SIGNED_HEADERS])])
        m = self._macs[key_id].copy()
        m.update(b"".join((text.encode("utf-8", "surrogateescape"), b"%d:" % len(payload), payload)))
        return m.hexdigest()

    def sign(self, subject: str, headers: MutableMapping[str, str], payload: bytes) -> MutableMapping[str, str]:
        """Add Kve-Key and Kve-Sig to `headers` (in place; returned)."""
        headers[H_KEY] = self.key_id
        headers[H_SIG] = self._mac(self.key_id, subject, headers, payload)
        return headers

    def verify(self, subject: str, headers: Mapping[str, str], payload: bytes) -> AuthFailure | None:
        """None when a known key signed exactly this subject, these headers and payload; else why not."""
        sig = headers.get(H_SIG)
        if not sig:
            return "unsigned"
        key_id = headers.get(H_KEY) or ""
        if key_id not in self._macs:
            return "unknown_key"
        if not isinstance(sig, str) or not hmac.compare_digest(sig, self._mac(key_id, subject, headers, payload)):
            return "bad_signature"
        return None


def write_key_file(path: str | os.PathLike[str], *, force: bool = False) -> SignKey:
    """A new random key written to `path`, created private (0600); FileExistsError unless `force`."""
    key = SignKey.generate()
    name = os.fspath(path)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(name, flags, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write("# kvevents JetStream sign key (HMAC-SHA256): give it to bridges and consumers only\n")
        f.write(key.hex_lines())
    os.chmod(name, 0o600)
    return SignKey.from_file(name)
