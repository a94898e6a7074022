"""The contract tests as a product: check any engine's hashes, stream, replay and invariants.

`hashkit` checks a hash function through a JSON-lines adapter; `stream` observes a live
publisher and `rules` judges what it saw; `drive` sends prompts to an OpenAI-compatible server
and checks the events they cause; `report` renders the verdicts. The CLI is `kvevents conformance`.
"""

from kvevents.conformance.report import Report, RuleResult, Status

__all__ = ["Report", "RuleResult", "Status"]
