"""Text and chat prompts to token ids, rendered as vLLM and SGLang render them.

A router that hashes other tokens than the engine cached finds no overlap at all (raw text vs
the chat-templated prompt is the usual cause), so this module follows the engines' own path:
- a completion prompt (`prompt`) is the tokenizer's encoding *with* its special tokens (its
  post-processor adds a BOS where the model has one), as both engines tokenize /v1/completions;
- a chat (`messages`) is the model's chat template rendered to text (Jinja, sandboxed, with the
  tokenizer's special tokens, `add_generation_prompt`, `continue_final_message`), then encoded
  *without* special tokens: the template carries its own BOS, so none is added twice.

The tokenizer comes from a Hugging Face directory (`tokenizer.json`, `tokenizer_config.json`,
optional `chat_template.jinja` / `special_tokens_map.json`), loaded with the `tokenizers` library;
templates run in jinja2's immutable sandbox, so a template cannot reach Python objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["PromptRenderer", "RenderError", "SPECIAL_TOKEN_NAMES"]

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
MAX_TEMPLATE_CHARS = 1 << 20  # a chat template is a few KB; refuse a file that is not one
MAX_MESSAGES = 4096


class RenderError(ValueError):
    """A prompt or chat that cannot be rendered (bad messages, a template that raised)."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken map."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _pick_template(raw: Any, where: Path) -> str | None:
    """chat_template is a string, or a list of {name, template} (the one named "default" is used)."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        chosen = named.get("default")
        if isinstance(chosen, str):
            return chosen
    raise ValueError(f"{where}: chat_template must be a string or a list with a 'default' entry")


@dataclass(frozen=True, slots=True)
class _Config:
    template: str | None
    special: dict[str, str]
    extra_special: tuple[str, ...]


def _load_config(directory: Path) -> _Config:
    cfg = _read_json(directory / "tokenizer_config.json")
    special_map = _read_json(directory / "special_tokens_map.json")
    template = _pick_template(cfg.get("chat_template"), directory / "tokenizer_config.json")
    jinja_file = directory / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        if jinja_file.stat().st_size > MAX_TEMPLATE_CHARS:
            raise ValueError(f"{jinja_file}: larger than {MAX_TEMPLATE_CHARS} bytes, not a chat template")
        template = jinja_file.read_text(encoding="utf-8")
    special: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = _token_text(cfg.get(name, special_map.get(name)))
        if text is not None:
            special[name] = text
    extra = cfg.get("additional_special_tokens", special_map.get("additional_special_tokens")) or []
    extra_special = tuple(t for t in (_token_text(x) for x in extra) if t is not None)
    return _Config(template, special, extra_special)


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RenderError("messages must be a non-empty list of {role, content} objects")
    if len(messages) > MAX_MESSAGES:
        raise RenderError(f"messages: at most {MAX_MESSAGES}, got {len(messages)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RenderError(f"messages[{i}]: expected an object with a string 'role'")
    return messages


class PromptRenderer:
    """A model's tokenizer and chat template: `encode_prompt` for text, `encode_chat` for chats."""

    def __init__(
        self, tokenizer: Any, template: str | None, special: Mapping[str, str], extra_special: Sequence[str] = ()
    ):
        self.tokenizer = tokenizer
        self.template_source = template
        self.special_tokens = dict(special)
        self.additional_special_tokens = list(extra_special)
        self._template = _compile(template) if template is not None else None

    @classmethod
    def from_dir(cls, directory: str | Path) -> PromptRenderer:
        """Load a Hugging Face tokenizer directory; ValueError naming what is missing or malformed."""
        from tokenizers import Tokenizer

        d = Path(directory)
        if not (d / "tokenizer.json").is_file():
            raise ValueError(f"{d}: no tokenizer.json (a Hugging Face tokenizer directory is needed)")
        try:
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as exc:  # noqa: BLE001 - the tokenizers library raises its own exception type
            raise ValueError(f"{d / 'tokenizer.json'}: not a tokenizer ({exc})") from None
        cfg = _load_config(d)
        return cls(tok, cfg.template, cfg.special, cfg.extra_special)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode_prompt(self, text: str) -> list[int]:
        """A completion prompt as the engines tokenize it: with the tokenizer's special tokens."""
        if not isinstance(text, str):
            raise RenderError("prompt must be a string")
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def render_chat(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat as the model's template renders it (the text an engine then encodes)."""
        if self._template is None:
            raise RenderError("this tokenizer has no chat_template: send `prompt` or `tokens`")
        msgs = _check_messages(messages)
        if continue_final_message and add_generation_prompt:
            raise RenderError("continue_final_message and add_generation_prompt exclude each other")
        variables: dict[str, Any] = dict(template_kwargs or {})
        variables.update(self.special_tokens)
        variables["additional_special_tokens"] = self.additional_special_tokens
        variables.update(messages=msgs, add_generation_prompt=add_generation_prompt, tools=tools, documents=None)
        try:
            text = self._template.render(**variables)
        except RenderError:
            raise
        except Exception as exc:  # noqa: BLE001 - any template failure is a bad request, not a crash
            raise RenderError(f"chat template failed: {type(exc).__name__}: {exc}") from None
        return _cut_after_final(text, msgs) if continue_final_message else text

    def encode_chat(self, messages: Any, **options: Any) -> list[int]:
        """A chat as the engines tokenize it: the rendered template, without added special tokens."""
        text = self.render_chat(messages, **options)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def token_text(self, token_id: int) -> str:
        """One token's text (for a mismatch report)."""
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))


def _cut_after_final(text: str, messages: list[dict[str, Any]]) -> str:
    """continue_final_message: the text ends where the final message's content ends, so the model
    continues it instead of starting a new turn."""
    content = messages[-1].get("content")
    if isinstance(content, list):  # OpenAI content parts: the text parts, joined
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    final = str(content or "").strip()
    at = text.rfind(final) if final else -1
    if at < 0:
        raise RenderError("continue_final_message: the final message's content is not in the rendered chat")
    return text[: at + len(final)]


def _raise(message: str) -> None:
    raise RenderError(f"chat template: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _compile(source: str) -> Any:
    """A chat template in jinja2's immutable sandbox, with the helpers chat templates expect."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if len(source) > MAX_TEMPLATE_CHARS:
        raise ValueError(f"chat_template: larger than {MAX_TEMPLATE_CHARS} characters")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise ValueError(f"chat_template does not compile: {exc}") from None
