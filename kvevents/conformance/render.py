"""`kvevents conformance render`: does the router tokenize prompts exactly as the engine does?

"Overlap is always 0" usually means the router hashes other tokens than the engine cached (raw
text against the chat-templated prompt, a BOS added twice). This asks the engine's own
tokenization (vLLM's `POST /tokenize`, with `prompt` or with `messages`) for generated prompts and
chats and compares it token for token with `route --tokenizer`'s (kvevents.consumers.prompts); a
mismatch names the first differing position with both tokens' text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kvevents.conformance.drive import post_json
from kvevents.conformance.report import Report, RuleResult, Status
from kvevents.consumers.prompts import PromptRenderer, RenderError

__all__ = ["RenderCase", "render_cases", "check_render", "first_difference"]

_WORDS = "the a cat dog story tell me about how are you hello world system user helpful assistant".split()
_SYSTEM = "you are a helpful assistant"


@dataclass(frozen=True, slots=True)
class RenderCase:
    """One prompt (`prompt`) or chat (`messages`) and how the chat ends."""

    name: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    add_generation_prompt: bool = True

    def body(self) -> dict[str, Any]:
        """The engine's /tokenize body (vLLM's field names and defaults)."""
        if self.messages is not None:
            return {"messages": list(self.messages), "add_generation_prompt": self.add_generation_prompt}
        return {"prompt": self.prompt}


def render_cases(seed: int, count: int) -> list[RenderCase]:
    """`count` generated texts, single-turn chats, chats with a system prompt and multi-turn chats."""
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 12)))

    out: list[RenderCase] = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            out.append(RenderCase(f"prompt-{i}", prompt=text()))
        elif kind == 1:
            out.append(RenderCase(f"chat-{i}", messages=({"role": "user", "content": text()},)))
        elif kind == 2:
            msgs = ({"role": "system", "content": _SYSTEM}, {"role": "user", "content": text()})
            out.append(RenderCase(f"system-chat-{i}", messages=msgs))
        else:
            turns = [{"role": "system", "content": _SYSTEM}]
            for _ in range(rng.randint(2, 4)):
                turns += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
            turns.append({"role": "user", "content": text()})
            out.append(RenderCase(f"multi-turn-{i}", messages=tuple(turns), add_generation_prompt=i % 8 == 3))
    return out


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first index where the two token lists differ (a length difference counts), or None."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def _ours(renderer: PromptRenderer, case: RenderCase) -> list[int]:
    if case.messages is not None:
        return renderer.encode_chat(list(case.messages), add_generation_prompt=case.add_generation_prompt)
    return renderer.encode_prompt(str(case.prompt))


def _describe(renderer: PromptRenderer, case: RenderCase, ours: list[int], theirs: list[int], at: int) -> str:
    def tok(ids: list[int]) -> str:
        return f"{ids[at]} {renderer.token_text(ids[at])!r}" if at < len(ids) else "(end)"

    return f"{case.name}: first difference at token {at}: router {tok(ours)}, engine {tok(theirs)}"


def check_render(base_url: str, renderer: PromptRenderer, cases: list[RenderCase], timeout: float) -> Report:
    """Compare the engine's /tokenize with the router's rendering, case by case: rule `prompt-tokens`
    for text prompts, `chat-tokens` for chats. ValueError when the engine cannot be asked at all."""
    url = base_url.rstrip("/")
    url = url[: -len("/v1")] if url.endswith("/v1") else url  # the usual OpenAI base URL
    url += "/tokenize"
    rules = {
        "prompt-tokens": RuleResult("prompt-tokens", Status.PASS),
        "chat-tokens": RuleResult("chat-tokens", Status.PASS),
    }
    for case in cases:
        rule = rules["chat-tokens" if case.messages is not None else "prompt-tokens"]
        if case.messages is not None and not renderer.has_chat_template:
            rule.status, rule.detail = Status.NOT_CHECKABLE, "the tokenizer has no chat template"
            continue
        answer = post_json(url, case.body(), timeout)
        theirs = answer.get("tokens")
        if not isinstance(theirs, list) or not all(isinstance(t, int) for t in theirs):
            raise ValueError(f"POST {url}: the answer has no 'tokens' list of ids (is this vLLM's /tokenize?)")
        try:
            ours = _ours(renderer, case)
        except RenderError as exc:
            rule.checked += 1
            rule.status = Status.FAIL
            rule.examples.append(f"{case.name}: the router cannot render it: {exc}")
            continue
        rule.checked += 1
        at = first_difference(ours, theirs)
        if at is not None:
            rule.status = Status.FAIL
            if len(rule.examples) < 3:
                rule.examples.append(_describe(renderer, case, ours, theirs, at))
    for rule in rules.values():
        if rule.status is Status.FAIL:
            rule.detail = f"{len(rule.examples)}+ of {rule.checked} cases tokenize differently"
        elif rule.status is Status.PASS:
            rule.detail = f"{rule.checked} cases equal token for token"
    return Report("render", list(rules.values()), {"cases": len(cases), "tokenize_url": url})
