"""Paths into the checkout the tests run from."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GOLDEN_PATH = REPO / "schemas" / "golden" / "sglang-0.5.20.json"
VLLM_GOLDEN_PATH = REPO / "schemas" / "golden" / "vllm-0.33.json"
