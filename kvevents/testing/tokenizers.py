"""Small Hugging Face tokenizer directories built on the spot with the `tokenizers` library (no
download): a word-level vocabulary, optional BOS on encode, optional chat template."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SPECIALS", "CORPUS", "WITH_BOS", "CHATML", "make_tokenizer_dir"]

SPECIALS = ["[UNK]", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"]
CORPUS = [
    "hello world how are you",
    "you are a helpful assistant",
    "tell me a story about the cat and a dog",
    "user system",
]

# a template that writes its own BOS (Llama-2 style) and one that has none (ChatML style)
WITH_BOS = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>> {{ m['content'] }} <</SYS>> "
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% elif m['role'] == 'assistant' %}"
    " {{ m['content'] }} {{ eos_token }}{% else %}{{ raise_exception('unknown role ' + m['role']) }}"
    "{% endif %}{% endfor %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer_dir(where: Path, template: str | None, *, bos_on_encode: bool = True, name: str = "tok") -> Path:
    """`where/name` with tokenizer.json and tokenizer_config.json (bos <s>, eos </s>, the template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIALS))
    if bos_on_encode:  # the post-processor adds a BOS to every encoding with special tokens
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    d = where / name
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    cfg: dict = {"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": False}}
    if template is not None:
        cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d
