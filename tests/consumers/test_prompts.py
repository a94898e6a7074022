"""Text and chat prompts tokenized as the engines do (kvevents.consumers.prompts), with small
tokenizers built here by the `tokenizers` library (no download), and /score fed by them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kvevents.consumers.prompts import PromptRenderer, RenderError
from kvevents.consumers.service.core import RouterService
from kvevents.events import BlockStored
from kvevents.hashing import event_hashes_int64
from kvevents.testing.tokenizers import CHATML, WITH_BOS, make_tokenizer_dir
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.source import Source


def _tokenizer_dir(tmp_path: Path, template: str | None, bos_on_encode: bool = True) -> Path:
    return make_tokenizer_dir(tmp_path, template, bos_on_encode=bos_on_encode)


def _ids(r: PromptRenderer, text: str) -> list[int]:
    return list(r.tokenizer.encode(text, add_special_tokens=False).ids)


def test_a_text_prompt_gets_the_tokenizers_special_tokens(tmp_path: Path) -> None:
    r = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, None))
    bos = r.tokenizer.token_to_id("<s>")
    assert r.encode_prompt("hello world") == [bos, *_ids(r, "hello world")]
    plain = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, None, bos_on_encode=False))
    assert plain.encode_prompt("hello world") == _ids(plain, "hello world")


def test_a_template_that_writes_its_bos_gets_exactly_one(tmp_path: Path) -> None:
    r = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, WITH_BOS))
    bos = r.tokenizer.token_to_id("<s>")
    chat = [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": "hello"}]
    text = r.render_chat(chat)
    assert text == "<s><<SYS>> you are a helpful assistant <</SYS>> [INST] hello [/INST]"
    ids = r.encode_chat(chat)
    assert ids == _ids(r, text) and ids[0] == bos and ids.count(bos) == 1


def test_a_template_without_bos_gets_none_although_prompts_do(tmp_path: Path) -> None:
    r = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, CHATML))
    bos = r.tokenizer.token_to_id("<s>")
    chat = [{"role": "user", "content": "hello world"}]
    assert r.render_chat(chat) == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert bos not in r.encode_chat(chat)
    assert r.encode_prompt("hello world")[0] == bos


def test_multi_turn_chats_with_a_system_prompt_and_the_generation_prompt_options(tmp_path: Path) -> None:
    r = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, CHATML))
    chat = [
        {"role": "system", "content": "you are a helpful assistant"},
        {"role": "user", "content": "tell me a story"},
        {"role": "assistant", "content": "about cats"},
        {"role": "user", "content": "how are you"},
    ]
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
    assert r.render_chat(chat) == turns + "<|im_start|>assistant\n"
    assert r.render_chat(chat, add_generation_prompt=False) == turns
    partial = [*chat[:3]]
    cont = r.render_chat(partial, add_generation_prompt=False, continue_final_message=True)
    assert cont.endswith("<|im_start|>assistant\nabout cats")  # the model goes on with this message
    with pytest.raises(RenderError, match="exclude each other"):
        r.render_chat(partial, continue_final_message=True)


def test_bad_chats_and_templates_are_render_errors(tmp_path: Path) -> None:
    r = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, WITH_BOS))
    with pytest.raises(RenderError, match="unknown role tool"):
        r.render_chat([{"role": "tool", "content": "x"}])
    with pytest.raises(RenderError, match="non-empty list"):
        r.render_chat([])
    with pytest.raises(RenderError, match=r"messages\[0\]"):
        r.render_chat([{"content": "no role"}])
    sneaky = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, "{{ messages.__class__.__mro__ }}"))
    with pytest.raises(RenderError, match="chat template failed"):  # the sandbox refuses Python internals
        sneaky.render_chat([{"role": "user", "content": "x"}])
    none = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, None))
    with pytest.raises(RenderError, match="no chat_template"):
        none.render_chat([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="no tokenizer.json"):
        PromptRenderer.from_dir(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="does not compile"):
        PromptRenderer(r.tokenizer, "{% for %}", {})


def test_the_chat_template_may_live_in_chat_template_jinja(tmp_path: Path) -> None:
    d = _tokenizer_dir(tmp_path, None)
    (d / "chat_template.jinja").write_text(CHATML)
    r = PromptRenderer.from_dir(d)
    assert r.render_chat([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user\nhi")


def test_score_takes_prompt_and_messages_and_finds_the_worker_that_cached_them(tmp_path: Path) -> None:
    page = 4
    r = PromptRenderer.from_dir(_tokenizer_dir(tmp_path, CHATML))
    chat = [
        {"role": "system", "content": "you are a helpful assistant"},
        {"role": "user", "content": "tell me a story"},
    ]
    tokens = r.encode_chat(chat)
    pub = Publisher(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.1)
    service = RouterService([Source(pub.endpoint, pub.replay_endpoint, "w0")], page_size=page, renderer=r)
    service.start()
    try:
        whole = tokens[: len(tokens) // page * page]
        pub.publish([BlockStored(event_hashes_int64(whole, page, None), None, whole, page, None, "GPU", None)])
        deadline = time.monotonic() + 10
        while service.applied_seq("w0") is None and time.monotonic() < deadline:
            time.sleep(0.02)
        by_tokens = service.handle_score(json.dumps({"tokens": tokens}).encode())
        by_chat = service.handle_score(json.dumps({"messages": chat}).encode())
        assert by_chat[0] == 200 and by_chat[1]["best"] == "w0"
        assert by_chat[1]["workers"][0]["matched_pages"] == len(tokens) // page
        assert by_chat == by_tokens
        raw = service.handle_score(json.dumps({"prompt": "tell me a story"}).encode())
        assert raw[0] == 200 and raw[1]["best"] is None  # a raw prompt is other tokens: no overlap
        both = service.handle_score(json.dumps({"tokens": tokens, "prompt": "x"}).encode())
        assert both[0] == 400 and "exactly one of tokens, prompt, messages" in both[1]["error"]
        bad = service.handle_score(json.dumps({"messages": [{"content": "no role"}]}).encode())
        assert bad[0] == 400 and "messages[0]" in bad[1]["error"]
    finally:
        service.stop()
        pub.close()


def test_without_a_tokenizer_prompt_and_messages_are_a_clear_400() -> None:
    pub = Publisher(endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0)
    service = RouterService([Source(pub.endpoint, None, "w0")], page_size=4)
    try:
        status, body = service.handle_score(b'{"prompt": "hello"}')
        assert status == 400 and "--tokenizer" in body["error"]
        status, body = service.handle_score(b"{}")
        assert status == 400 and "got none" in body["error"]
    finally:
        service.stop()
        pub.close()
