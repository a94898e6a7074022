"""The flags every `--nats` command shares for trusting the bus (issue 28): `--sign-key FILE` (or
KVEVENTS_NATS_SIGN_KEY), `--insecure` and, for consumers, `--max-sources N`. `bus_trust` turns
them into the SignKey the bridge signs with and consumers check (None only with --insecure).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from kvevents.cli.app import user_error

__all__ = ["BRIDGE_INSECURE_HELP", "INSECURE_HELP", "MAX_SOURCES_HELP", "SIGN_KEY_HELP", "bus_trust"]

SIGN_KEY_HELP = (
    "The stream's HMAC key file, shared by the bridges and every consumer (`kvevents keys sign-key FILE` "
    "makes one; default: $KVEVENTS_NATS_SIGN_KEY): unsigned or badly signed messages are counted and dropped."
)
INSECURE_HELP = (
    "Without --sign-key: trust unsigned messages (anyone who may publish on kvevents.STREAM.> can then "
    "forge batches, epochs and snapshots)."
)
BRIDGE_INSECURE_HELP = "Without --sign-key: publish unsigned messages (consumers then need --insecure too)."
MAX_SOURCES_HELP = "Sources tracked per stream (64 dp ranks each); messages of further ones are counted and dropped."


def bus_trust(prog: str, sign_key: Optional[str], insecure: bool) -> Any:  # -> SignKey | None
    """The key of --sign-key FILE (or $KVEVENTS_NATS_SIGN_KEY); None with --insecure; else exit 2."""
    from kvevents.jetstream.signing import SignKey

    path = sign_key or os.environ.get("KVEVENTS_NATS_SIGN_KEY") or None
    if path is None:
        if not insecure:
            user_error(
                f"{prog} --nats: no --sign-key FILE: unsigned messages can be forged by anyone who may "
                "publish on the stream; give the bridges' key (`kvevents keys sign-key FILE` makes one) or --insecure"
            )
        return None
    if insecure and sign_key:
        user_error("give --sign-key FILE or --insecure, not both")
    try:
        return SignKey.from_file(path)
    except ValueError as exc:
        user_error(f"--sign-key: {exc}")
