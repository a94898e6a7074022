"""A POST /score body that a router fed by those publishers can answer, made from what they publish.

`kvevents tail ENDPOINT --json --count N | python3 -m kvevents.consumers.score_request` prints the
body of the newest chain head stored in those batches (a BlockStored without a parent: its token
ids, cache_salt and lora_name), so `curl -d @-` asks the router for a prefix some worker holds now
(the README's /score example against `kvevents serve`, whose simulated prompts are random tokens).
Exit 1 with one line on stderr when the lines hold no chain head.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any, TextIO

__all__ = ["score_body", "main"]


def score_body(lines: Iterable[str]) -> dict[str, Any] | None:
    """The /score body of the newest chain head in `kvevents tail --json` lines (other lines: notices,
    heartbeats, non-JSON, are passed over), or None."""
    found: dict[str, Any] | None = None
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or obj.get("type") != "batch":
            continue
        for ev in obj.get("events") or ():
            if isinstance(ev, dict) and ev.get("type") == "BlockStored" and ev.get("parent_block_hash") is None:
                tokens = ev.get("token_ids")
                if isinstance(tokens, list) and tokens:
                    found = {"tokens": tokens, "cache_salt": ev.get("cache_salt"), "lora_name": ev.get("lora_name")}
    return found


def main(stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    body = score_body(stdin)
    if body is None:
        sys.stderr.write("kvevents: no stored chain head (BlockStored without a parent) in the input lines\n")
        return 1
    stdout.write(json.dumps(body, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a module
    sys.exit(main())
