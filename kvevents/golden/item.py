"""One golden item and the outcome of its checks: what every golden checker reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Item", "short"]


@dataclass
class Item:
    """One golden item (a case, a seed, a wire entry ...) and the outcome of its checks."""

    section: str
    name: str
    checks: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.checks > 0 and not self.failures

    @property
    def detail(self) -> str:
        more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        return (self.failures[0] if self.failures else "no checks ran") + more

    def expect(self, what: str, got: Any, want: Any) -> None:
        self.checks += 1
        if got != want:
            self.failures.append(f"{what}: got {short(got)}, want {short(want)}")

    def run(self, what: str, fn: Callable[[], None]) -> None:
        """Run a group of expectations; an exception counts as one failure, never escapes."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a broken vector is a failed check, not a crash
            self.checks += 1
            self.failures.append(f"{what}: {type(exc).__name__}: {exc}")


def short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."
