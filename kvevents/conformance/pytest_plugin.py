"""pytest plugin (entry point `pytest11`): `pytest --kvevents-endpoint ...` runs the conformance
rules as tests, one per rule, so an engine's CI adds one line and gets JUnit XML from pytest.

Inert without `--kvevents-endpoint`: it only adds options. Bad options are one usage error (exit
4) before any test runs. The observation (or the drive, with `--kvevents-http`) runs once, at the
first rule test; failing rules fail, rules that are not offered or not checkable are skipped with
the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the kit is imported only when the options are given: an idle plugin costs nothing
    from kvevents.conformance.report import Report

DRIVE_RULES = ("drive-events", "adapters-same-hash", "salts-differ", "hashes-profile")


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("kvevents", "kvevents conformance kit (inert unless --kvevents-endpoint is given)")
    group.addoption("--kvevents-endpoint", default=None, help="live PUB endpoint of the engine under test")
    group.addoption("--kvevents-replay", default=None, help="its replay ROUTER endpoint")
    group.addoption("--kvevents-page-size", type=int, default=None, help="the engine's page (block) size")
    group.addoption("--kvevents-http", default=None, help="OpenAI-compatible base URL: also run the drive checks")
    group.addoption("--kvevents-duration", type=float, default=5.0, help="seconds to observe the stream")
    group.addoption("--kvevents-profile", default="contract", help="contract | vllm-sha256 | vllm-sha256_cbor")
    group.addoption("--kvevents-model", default=None, help="drive: the base model name")
    group.addoption("--kvevents-allow-epoch", action="store_true", help="accept the opt-in 4th batch element")


class ConformanceFailure(Exception):
    """A rule that failed: its detail and first examples are the test's failure text."""


class ConformanceRun(pytest.Collector):
    """The session's one observation or drive, and one test item per rule."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._report: Report | None = None
        self._error: str | None = None

    def collect(self) -> list[pytest.Item]:
        from kvevents.conformance.rules import RULES

        opt = self.config.getoption
        kind = "drive" if opt("kvevents_http") else "stream"
        rules = (list(DRIVE_RULES) if kind == "drive" else []) + list(RULES)
        return [RuleItem.from_parent(self, name=f"{kind}::{rule}", rule=rule) for rule in rules]

    def report(self) -> Report:
        if self._report is None and self._error is None:
            try:
                self._report = self._run()
            except ValueError as exc:
                self._error = str(exc)
        if self._error is not None:
            raise ConformanceFailure(f"the conformance run could not start: {self._error}")
        assert self._report is not None
        return self._report

    def _run(self) -> Report:
        opt = self.config.getoption
        if opt("kvevents_http"):
            from kvevents.conformance.drive import DriveOptions, drive

            return drive(
                DriveOptions(
                    opt("kvevents_http"),
                    opt("kvevents_endpoint"),
                    opt("kvevents_replay"),
                    opt("kvevents_page_size"),
                    opt("kvevents_profile"),
                    opt("kvevents_model"),
                )
            )
        from kvevents.conformance.stream import StreamOptions, observe

        return observe(
            StreamOptions(
                opt("kvevents_endpoint"),
                opt("kvevents_replay"),
                opt("kvevents_page_size"),
                opt("kvevents_duration"),
                opt("kvevents_profile"),
                opt("kvevents_allow_epoch"),
            )
        )


class RuleItem(pytest.Item):
    """One named rule of the run."""

    def __init__(self, *, rule: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rule = rule

    def runtest(self) -> None:
        from kvevents.conformance.report import Status

        assert isinstance(self.parent, ConformanceRun)
        result = self.parent.report().result(self.rule)
        if result.status is Status.FAIL:
            raise ConformanceFailure(
                "\n".join([f"{self.rule}: {result.detail}", *[f"  - {e}" for e in result.examples[:8]]])
            )
        if result.status is not Status.PASS:
            pytest.skip(f"{self.rule}: {result.status.value}: {result.detail}")

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "kvevents-conformance", None, f"kvevents conformance {self.name}"


def _check_options(config: pytest.Config) -> None:
    """The options, checked before any test runs: a bad one is one usage error, not a failed test
    per rule."""
    from kvevents.conformance.profiles import PROFILES
    from kvevents.conformance.stream import StreamOptions

    opt = config.getoption
    if opt("kvevents_page_size") is None:
        raise pytest.UsageError("--kvevents-endpoint needs --kvevents-page-size")
    if opt("kvevents_profile") not in PROFILES:
        raise pytest.UsageError(
            f"--kvevents-profile must be one of {', '.join(PROFILES)}, got {opt('kvevents_profile')!r}"
        )
    http = opt("kvevents_http")
    if http is not None and not http.startswith(("http://", "https://")):
        raise pytest.UsageError(f"--kvevents-http must be a URL (http://HOST:PORT), got {http!r}")
    stream = StreamOptions(
        opt("kvevents_endpoint"), opt("kvevents_replay"), opt("kvevents_page_size"), opt("kvevents_duration")
    )
    try:
        stream.validate()
    except ValueError as exc:
        raise pytest.UsageError(f"kvevents conformance: {exc}") from None


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("kvevents_endpoint"):
        _check_options(config)  # before collection: one ERROR line, exit 4


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect: the rule tests are selectable like any other
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("kvevents_endpoint"):
        return
    run = ConformanceRun.from_parent(session, name="kvevents-conformance")
    # collected through pytest's own hooks, so the count ("collected N items") and reports include them
    session.ihook.pytest_collectstart(collector=run)
    report = session.ihook.pytest_make_collect_report(collector=run)
    session.ihook.pytest_collectreport(report=report)
    items.extend(x for x in report.result if isinstance(x, pytest.Item))
