"""Verdicts per named rule and their rendering (table or JSON); exit code 0 only if all applicable pass."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Report", "RuleResult", "Status"]


class Status(str, Enum):
    """Outcome of one rule: only FAIL makes a run fail; the other two are not applicable."""

    PASS = "pass"
    FAIL = "fail"
    NOT_OFFERED = "not offered"
    NOT_CHECKABLE = "not checkable"


@dataclass
class RuleResult:
    """One rule's verdict: a status, a one-line detail and a few examples of what failed."""

    rule: str
    status: Status
    detail: str = ""
    checked: int = 0
    examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "status": self.status.value,
            "detail": self.detail,
            "checked": self.checked,
            "examples": list(self.examples),
        }


@dataclass
class Report:
    """All verdicts of one conformance run plus a few figures (batches seen, ...)."""

    kind: str
    results: list[RuleResult] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no rule failed (not offered / not checkable do not count against)."""
        return all(r.status is not Status.FAIL for r in self.results)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def result(self, rule: str) -> RuleResult:
        """The verdict of `rule`; KeyError names the rules there are."""
        for r in self.results:
            if r.rule == rule:
                return r
        raise KeyError(f"no rule {rule!r} in this report (rules: {', '.join(r.rule for r in self.results)})")

    def failed(self) -> list[str]:
        return [r.rule for r in self.results if r.status is Status.FAIL]

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ok": self.ok,
            "failed": self.failed(),
            "figures": dict(self.figures),
            "rules": [r.as_dict() for r in self.results],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, default=str)

    def table(self, max_examples: int = 3) -> str:
        """A fixed-width table, one row per rule, failures' first examples indented below."""
        width = max([len(r.rule) for r in self.results] + [4])
        lines = [f"{'rule':<{width}}  {'status':<13}  {'checked':>7}  detail"]
        for r in self.results:
            lines.append(f"{r.rule:<{width}}  {r.status.value:<13}  {r.checked:>7}  {r.detail}")
            if r.status is Status.FAIL:
                for ex in r.examples[:max_examples]:
                    lines.append(f"{'':<{width}}    - {ex}")
        verdict = "PASS" if self.ok else f"FAIL ({', '.join(self.failed())})"
        figures = " ".join(f"{k}={v}" for k, v in self.figures.items())
        lines.append(f"{self.kind}: {verdict}" + (f"  [{figures}]" if figures else ""))
        return "\n".join(lines)
