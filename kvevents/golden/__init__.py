"""Golden-vector checks: this installation against values computed by running the engines' own code
(SGLang 0.5.20, vLLM 0.33). `check_golden` takes a parsed golden file of either kind."""

from kvevents.golden.sglang import Item, check_golden

__all__ = ["Item", "check_golden"]
