"""`kvevents schema`: the JSON Schema of a batch payload (kvevents.events.batch_json_schema)."""

from __future__ import annotations

import json
import sys


def schema() -> None:
    """Print the JSON Schema of a batch payload (generated from the event structs)."""
    from kvevents.events import batch_json_schema

    sys.stdout.write(json.dumps(batch_json_schema(), indent=2) + "\n")
