"""One rule's running tally while a stream is judged: checks, failures, unknowns, a few examples."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Tally", "MAX_EXAMPLES"]

MAX_EXAMPLES = 8


@dataclass
class Tally:
    """What one rule saw so far (conformance/rules.py turns it into a RuleResult)."""

    checked: int = 0
    failed: int = 0
    unknown: int = 0
    offered: bool = True
    note: str = ""
    seen: str = ""  # what a pass observed, said in its detail (the replay framing)
    examples: list[str] = field(default_factory=list)

    def ok(self, n: int = 1) -> None:
        self.checked += n

    def fail(self, text: str) -> None:
        self.checked += 1
        self.failed += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(text)
