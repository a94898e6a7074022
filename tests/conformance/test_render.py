"""`kvevents conformance render`: the router's tokenization against an engine's POST /tokenize.

The engines here are small HTTP servers on 127.0.0.1 with vLLM's /tokenize fields; the faithful
one renders chats with its own jinja2 environment, the others make the two classic mistakes
(chats tokenized as raw text, a BOS added twice)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from kvevents.conformance.render import check_render, first_difference, render_cases
from kvevents.consumers.prompts import PromptRenderer
from kvevents.testing.tokenizers import CHATML, WITH_BOS, make_tokenizer_dir
from tests.helpers.cli import CliResult, invoke


def _engine_tokenize(tok_dir: Path, mistake: str) -> Callable[[dict[str, Any]], list[int]]:
    """An engine's /tokenize written independently of kvevents.consumers.prompts."""
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(cfg["chat_template"])

    def tokenize(body: dict[str, Any]) -> list[int]:
        if "prompt" in body:
            return tok.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True)).ids
        if mistake == "raw":
            return tok.encode(" ".join(m["content"] for m in body["messages"]), add_special_tokens=True).ids
        text = template.render(
            messages=body["messages"], add_generation_prompt=body.get("add_generation_prompt", True),
            bos_token="<s>", eos_token="</s>",
        )  # fmt: skip
        return tok.encode(text, add_special_tokens=mistake == "double-bos").ids

    return tokenize


class _Engine:
    def __init__(self, tokenize: Callable[[dict[str, Any]], list[int]]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                ids = tokenize(body) if self.path == "/tokenize" else None
                out = json.dumps({"tokens": ids, "count": len(ids or [])}).encode()
                self.send_response(200 if ids is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # poll 0.02 s: shutdown() waits out one poll (0.5 s by default)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture(params=[CHATML, WITH_BOS], ids=["chatml", "bos-template"])
def tok_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return make_tokenizer_dir(tmp_path, request.param)


@pytest.fixture()
def engine(request: pytest.FixtureRequest, tok_dir: Path) -> Iterator[_Engine]:
    e = _Engine(_engine_tokenize(tok_dir, getattr(request, "param", "faithful")))
    yield e
    e.close()


def test_a_faithful_engine_passes_every_case(engine: _Engine, tok_dir: Path) -> None:
    report = check_render(engine.url + "/v1", PromptRenderer.from_dir(tok_dir), render_cases(3, 24), 5.0)
    assert report.ok, report.table()
    assert report.result("prompt-tokens").checked == 6 and report.result("chat-tokens").checked == 18


@pytest.mark.parametrize("engine", ["raw", "double-bos"], indirect=True)
def test_an_engine_that_renders_chats_otherwise_fails_with_the_first_differing_token(
    engine: _Engine, tok_dir: Path
) -> None:
    report = check_render(engine.url, PromptRenderer.from_dir(tok_dir), render_cases(3, 8), 5.0)
    assert report.result("prompt-tokens").status.value == "pass"
    chat = report.result("chat-tokens")
    assert chat.status.value == "fail" and chat.examples
    assert "first difference at token" in chat.examples[0]
    assert "router" in chat.examples[0] and "engine" in chat.examples[0]  # both tokens, with their text


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_the_cli_exits_0_on_a_match_1_on_a_mismatch_and_2_on_a_bad_tokenizer(tmp_path: Path) -> None:
    tok = make_tokenizer_dir(tmp_path, CHATML)
    good, bad = _Engine(_engine_tokenize(tok, "faithful")), _Engine(_engine_tokenize(tok, "raw"))
    try:

        def run(*args: str) -> CliResult:  # the real entry point, in process (the command ends by itself)
            return invoke("conformance", "render", *args, timeout=60)

        ok = run("--http", good.url, "--tokenizer", str(tok), "--cases", "8")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        wrong = run("--http", bad.url, "--tokenizer", str(tok), "--cases", "8", "--json")
        assert wrong.returncode == 1
        assert json.loads(wrong.stdout)["failed"] == ["chat-tokens"]
        missing = run("--http", good.url, "--tokenizer", str(tmp_path / "nope"))
        assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
        assert "no tokenizer.json" in missing.stderr
    finally:
        good.close()
        bad.close()
