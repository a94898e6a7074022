"""Golden-vector checks: this installation against values computed by running the engines' own code
(SGLang 0.5.20, vLLM 0.33). `check_golden` takes a parsed golden file of either kind.

| file | what it owns |
|---|---|
| `item.py` | `Item`: one golden item and its check outcome |
| `sglang.py` | the contract's vectors (schemas/golden/sglang-0.5.20.json): cases, seeds, scenarios, wire bytes |
| `vllm.py` | vLLM 0.33's own hash chain and events (schemas/golden/vllm-0.33.json) |
"""

from typing import Any

from kvevents.golden.item import Item
from kvevents.golden.sglang import SGLANG_SECTIONS, check_sglang_golden
from kvevents.golden.vllm import check_vllm_golden, is_vllm_golden

__all__ = ["Item", "check_golden", "golden_kind", "SGLANG_SECTIONS"]


def golden_kind(golden: dict[str, Any]) -> str | None:
    """ "vllm" or "sglang" for a golden file (an SGLang one holds at least one of its sections),
    None for a JSON object that is neither: a file given by mistake, not a failed check."""
    if is_vllm_golden(golden):
        return "vllm"
    return "sglang" if any(k in golden for k in SGLANG_SECTIONS) else None


def check_golden(golden: dict[str, Any]) -> list[Item]:
    """Check every section of a golden file of either kind; one Item per golden item, in file order."""
    if is_vllm_golden(golden):  # schemas/golden/vllm-*.json: vLLM's own hash chain
        return check_vllm_golden(golden)
    return check_sglang_golden(golden)
