"""`route --proxy` (issue 26 part 3) over real sockets: scripted workers on 127.0.0.1 and real
publishers filling the router's index; the proxy picks the worker holding the prefix, passes event
streams through as they arrive, counts in-flight blocks, retries a refused connection on the next
worker and never once an answer began."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from kvevents.consumers.cost import CostSettings
from kvevents.consumers.prompts import PromptRenderer
from kvevents.consumers.service.proxy import ProxyConfig
from kvevents.consumers.service.proxy_request import ModelNames, plan_request
from kvevents.consumers.service.proxy_targets import Targets, WorkerUrl, parse_worker_url
from kvevents.consumers.service.scoring import RoutingOptions
from kvevents.consumers.worker_key import WorkerKey
from kvevents.testing.tokenizers import CHATML, make_tokenizer_dir
from tests.helpers.proxy_rig import PAGE, Handler, Rig, Upstream, dead_url, wait_for

DOC = list(range(1000, 1000 + 5 * PAGE + 2))  # five whole pages and a partial one


@pytest.fixture
def upstreams():
    made: list[Upstream] = []

    def make(name: str, script: Any = None, **kw: Any) -> Upstream:
        u = Upstream(name, script, **kw) if script is not None else Upstream(name, **kw)
        made.append(u)
        return u

    yield make
    for u in made:
        u.close()


def _post(rig: Rig, path: str, body: dict, **kw: Any) -> httpx.Response:
    return httpx.post(rig.base + path, json=body, timeout=10, **kw)


def test_the_request_goes_to_the_worker_holding_its_prefix_and_the_answer_names_it(upstreams) -> None:
    a, b = upstreams("a"), upstreams("b")
    rig = Rig(["a", "b"], {"a": a.url, "b": b.url})
    try:
        rig.store("b", DOC[: 3 * PAGE])
        for _ in range(3):
            r = _post(rig, "/v1/completions", {"model": "base-model", "prompt": DOC, "max_tokens": 1})
            assert r.status_code == 200 and r.headers["x-kvevents-worker"] == "b", r.text
            assert r.headers["x-kvevents-dp-rank"] == "0" and r.json()["system_fingerprint"] == "b"
        assert len(b.requests) == 3 and not a.requests
        assert json.loads(b.requests[0]["body"])["prompt"] == DOC  # the body goes on unchanged
        models = httpx.get(rig.base + "/v1/models", timeout=10).json()
        assert models == {"object": "list", "data": [{"id": "base-model", "object": "model"}]}
        rows = {(w["worker"], w["dp_rank"]): w for w in httpx.get(rig.base + "/status.json").json()["proxy"]["workers"]}
        assert rows[("b", 0)]["requests_total"] == 3 and rows[("b", 0)]["answers"] == {"2xx": 3}
        assert rows[("b", 0)]["ttfb_p50_s"] is not None and rows[("b", 0)]["errors_total"] == 0
        metrics = httpx.get(rig.base + "/metrics").text
        assert 'kvevents_router_proxy_requests_total{dp_rank="0",worker="b"} 3.0' in metrics
        assert 'kvevents_router_proxy_ttfb_seconds_count{dp_rank="0",worker="b"} 3.0' in metrics
        page = httpx.get(rig.base + "/").text
        assert '<table id="proxy">' in page and 'data-k="requests_total">3<' in page
    finally:
        rig.close()


def _gated(head: threading.Event, rest: threading.Event):
    def script(h: Handler, body: dict) -> None:
        head.wait(10)
        h.head_sse()
        h.chunk(b"data: one\n\n")
        rest.wait(10)
        h.chunk(b"data: two\n\ndata: [DONE]\n\n")
        h.wfile.write(b"0\r\n\r\n")

    return script


def test_an_event_stream_passes_through_as_it_arrives_and_its_blocks_count_until_it_ends(upstreams) -> None:
    head, rest, got_first = threading.Event(), threading.Event(), threading.Event()
    a = upstreams("a", _gated(head, rest))
    rig = Rig(["a"], {"a": a.url})
    seen: list[bytes] = []
    try:
        rig.store("a", DOC[: 2 * PAGE])

        def client() -> None:
            body = {"prompt": DOC, "stream": True}
            with httpx.stream("POST", rig.base + "/v1/completions", json=body, timeout=10) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                assert r.headers["x-kvevents-worker"] == "a"
                for chunk in r.iter_raw():
                    seen.append(chunk)
                    got_first.set()

        t = threading.Thread(target=client)
        t.start()
        wait_for(lambda: a.requests, what="the request at the worker")
        key = WorkerKey("a", 0)
        assert rig.proxy.inflight() == {key: (3, 5)}  # 5 pages, 2 held: 3 to prefill; 5 held while decoding
        assert rig.service.inflight_source is not None and rig.service.inflight_source() == {key: (3, 5)}
        head.set()
        assert got_first.wait(10), "the first event did not come through before the stream went on"
        assert b"".join(seen) == b"data: one\n\n"
        assert rig.proxy.inflight() == {key: (0, 5)}  # the first byte ends the prefill
        rest.set()
        t.join(10)
        assert b"".join(seen) == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"
        wait_for(lambda: rig.proxy.inflight() == {key: (0, 0)}, what="the blocks to leave with the answer")
    finally:
        head.set()
        rest.set()
        rig.close()


def test_a_refused_connection_is_retried_on_the_next_worker_and_then_tried_last(upstreams) -> None:
    now = [0.0]
    b = upstreams("b")
    rig = Rig(["a", "b"], {"a": dead_url(), "b": b.url}, config=ProxyConfig(down_for_s=5), clock=lambda: now[0])
    try:
        rig.store("a", DOC)  # a holds the whole prefix: ranked first
        r = _post(rig, "/v1/completions", {"prompt": DOC})
        assert r.status_code == 200 and r.headers["x-kvevents-worker"] == "b"
        status = rig.service.status_view()["proxy"]
        errors = {w["worker"]: w["errors"] for w in status["workers"]}
        assert errors == {"a": {"connect": 1}, "b": {}} and status["retries_total"] == 1
        _post(rig, "/v1/completions", {"prompt": DOC})  # a is down: b first, no new error on a
        assert rig.service.status_view()["proxy"]["retries_total"] == 1
        now[0] += 6  # a is tried first again
        assert _post(rig, "/v1/completions", {"prompt": DOC}).headers["x-kvevents-worker"] == "b"
        assert rig.service.status_view()["proxy"]["retries_total"] == 2
        assert len(b.requests) == 3
        assert rig.proxy.inflight() == {WorkerKey("a", 0): (0, 0), WorkerKey("b", 0): (0, 0)}
    finally:
        rig.close()


def _head_then_close(h: Handler, body: dict) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", "100")
    h.end_headers()
    h.wfile.flush()
    h.close_connection = True


def _first_event_then_close(h: Handler, body: dict) -> None:
    h.head_sse()
    h.chunk(b"data: one\n\n")
    h.close_connection = True


def test_an_answer_that_began_is_never_retried_elsewhere(upstreams) -> None:
    a, b = upstreams("a", _head_then_close), upstreams("b")
    rig = Rig(["a", "b"], {"a": a.url, "b": b.url})
    try:
        rig.store("a", DOC)
        r = _post(rig, "/v1/completions", {"prompt": DOC})
        assert r.status_code == 502 and "answer broken off" in r.json()["error"]["message"]
        a.script = _first_event_then_close
        with httpx.stream("POST", rig.base + "/v1/completions", json={"prompt": DOC, "stream": True}) as s:
            text = b"".join(s.iter_raw()).decode()
        assert text.startswith("data: one\n\n") and "a: answer broken off" in text and "[DONE]" not in text
        assert not b.requests and len(a.requests) == 2
        errors = {w["worker"]: w["errors"] for w in rig.service.status_view()["proxy"]["workers"]}
        assert errors["a"] == {"stream": 2}
    finally:
        rig.close()


def test_a_chat_is_routed_by_its_rendered_prompt_and_sent_unchanged(upstreams, tmp_path) -> None:
    renderer = PromptRenderer.from_dir(make_tokenizer_dir(tmp_path, CHATML))
    chat = [
        {"role": "system", "content": "you are a helpful assistant"},
        {"role": "user", "content": "tell me a story"},
    ]
    a, b = upstreams("a"), upstreams("b")
    rig = Rig(["a", "b"], {"a": a.url, "b": b.url}, renderer=renderer)
    try:
        rig.store("a", renderer.encode_chat(chat))
        raw = json.dumps({"model": "base-model", "messages": chat, "temperature": 0}).encode()
        headers = {"content-type": "application/json", "authorization": "Bearer the-engines-own-key"}
        for _ in range(2):
            r = httpx.post(rig.base + "/v1/chat/completions", content=raw, headers=headers, timeout=10)
            assert r.status_code == 200 and r.headers["x-kvevents-worker"] == "a"
        assert [q["body"] for q in a.requests] == [raw, raw] and not b.requests
        assert a.requests[0]["path"] == "/v1/chat/completions"
        assert a.requests[0]["headers"]["authorization"] == "Bearer the-engines-own-key"  # no router key: passed on
        r = _post(rig, "/v1/completions", {"prompt": "tell me a story"})  # text through the tokenizer
        assert r.status_code == 200 and rig.service.status_view()["proxy"]["load_only_total"] == {}
    finally:
        rig.close()


def test_without_a_tokenizer_text_goes_to_the_worker_with_fewer_blocks_in_flight(upstreams) -> None:
    release = threading.Event()

    def hold(h: Handler, body: dict) -> None:
        release.wait(10)
        h.json(200, {"system_fingerprint": h.server.owner.name})

    a, b = upstreams("a", hold), upstreams("b", hold)
    rig = Rig(["a", "b"], {"a": a.url, "b": b.url})
    results: list[httpx.Response] = []
    try:
        first = threading.Thread(target=lambda: results.append(_post(rig, "/v1/completions", {"prompt": "x" * 400})))
        first.start()
        wait_for(lambda: a.requests or b.requests, what="the first request at a worker")
        busy = "a" if a.requests else "b"
        assert rig.proxy.inflight()[WorkerKey(busy, 0)] == (25, 25)  # 400 bytes ~ 100 tokens ~ 25 pages
        second = threading.Thread(target=lambda: results.append(_post(rig, "/v1/completions", {"prompt": "y"})))
        second.start()
        wait_for(lambda: a.requests and b.requests, what="the second request at the other worker")
        release.set()
        first.join(10)
        second.join(10)
        assert sorted(r.headers["x-kvevents-worker"] for r in results) == ["a", "b"]
        assert rig.service.status_view()["proxy"]["load_only_total"] == {"no tokenizer": 2}
    finally:
        release.set()
        rig.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_worker_not_listed_yet_is_placed_by_its_own_cost(upstreams, temperature: float) -> None:
    """b has a URL but no publisher (the index never lists it): idle, it costs less than a busy a
    and takes the second request; with a temperature the drawn pick (a) still goes first."""
    release = threading.Event()

    def hold(h: Handler, body: dict) -> None:
        release.wait(10)
        h.json(200, {"system_fingerprint": h.server.owner.name})

    a, b = upstreams("a", hold), upstreams("b", hold)
    routing = RoutingOptions(cost=CostSettings(temperature=temperature))
    rig = Rig(["a"], {"a": a.url, "b": b.url}, routing=routing)
    results: list[httpx.Response] = []
    try:
        first = threading.Thread(target=lambda: results.append(_post(rig, "/v1/completions", {"prompt": "x" * 400})))
        first.start()
        wait_for(lambda: a.requests, what="the first request at the listed worker (a tie goes to it)")
        assert not b.requests
        second = threading.Thread(target=lambda: results.append(_post(rig, "/v1/completions", {"prompt": "y"})))
        second.start()
        want = a if temperature else b
        wait_for(lambda: len(want.requests) == (2 if temperature else 1), what="the second request")
        release.set()
        first.join(10)
        second.join(10)
        assert sorted(r.headers["x-kvevents-worker"] for r in results) == (["a", "a"] if temperature else ["a", "b"])
    finally:
        release.set()
        rig.close()


def test_a_worker_without_a_url_gets_no_request_whatever_it_holds(upstreams) -> None:
    b = upstreams("b")
    rig = Rig(["a", "b"], {"b": b.url})
    try:
        rig.store("a", DOC)
        assert rig.service.handle_score(json.dumps({"tokens": DOC}).encode())[1]["best"] == "a"
        assert _post(rig, "/v1/completions", {"prompt": DOC}).headers["x-kvevents-worker"] == "b"
    finally:
        rig.close()


def test_bad_bodies_and_no_worker_answering_are_openai_errors(upstreams) -> None:
    rig = Rig(["a", "b"], {"a": dead_url(), "b": dead_url()})
    try:
        r = httpx.post(rig.base + "/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("body is not valid JSON")
        assert _post(rig, "/v1/completions", [1, 2]).status_code == 400  # type: ignore[arg-type]
        r = _post(rig, "/v1/completions", {"prompt": DOC})
        assert r.status_code == 502 and "no worker answered (2 tried)" in r.json()["error"]["message"]
        assert "a (http://127.0.0.1:" in r.json()["error"]["message"]
        assert httpx.get(rig.base + "/v1/models").status_code == 502
    finally:
        rig.close()


def test_a_model_an_adapter_is_scored_with_its_lora_name(upstreams) -> None:
    listing = [{"id": "base-model", "object": "model"}, {"id": "sql", "object": "model", "parent": "base-model"}]
    a, b = upstreams("a", models=listing), upstreams("b", models=listing)
    rig = Rig(["a", "b"], {"a": a.url, "b": b.url})
    try:
        rig.store("a", DOC[: 2 * PAGE])  # the base model's blocks (credited to any adapter: a names none)
        rig.store("b", DOC, lora_name="sql")  # the adapter's, never the base model's
        assert _post(rig, "/v1/completions", {"model": "sql", "prompt": DOC}).headers["x-kvevents-worker"] == "b"
        assert _post(rig, "/v1/completions", {"model": "base-model", "prompt": DOC}).headers["x-kvevents-worker"] == "a"
    finally:
        rig.close()


def test_worker_urls_and_plans() -> None:
    assert parse_worker_url("w1#dp2=http://h:8000/v1/") == WorkerUrl("w1", 2, "http://h:8000")
    assert parse_worker_url("a#b=https://h") == WorkerUrl("a#b", None, "https://h")
    for bad in ("w1", "=http://h:1", "w=ftp://h", "w=http://"):
        with pytest.raises(ValueError, match="--worker-url"):
            parse_worker_url(bad)
    plan = plan_request(
        "completions", {"prompt": [[1, 2, 3, 4], [5] * 8], "cache_salt": "t"}, tokenizer=False, lora_name=None
    )
    assert plan.score == {"tokens": [1, 2, 3, 4], "lora_name": None, "cache_salt": "t"} and plan.pages(1, 4) == 3
    plan = plan_request(
        "chat", {"messages": [{"role": "user", "content": "abcdefgh"}]}, tokenizer=False, lora_name=None
    )
    assert plan.score is None and plan.why_unscored == "no tokenizer" and plan.pages(None, 1) == 3  # "user" + 8 bytes
    targets = Targets(
        [WorkerUrl("w", None, "http://all"), WorkerUrl("w", 1, "http://one"), WorkerUrl("v", 2, "http://v")]
    )
    assert targets.url_for(WorkerKey("w", 1)) == "http://one" and targets.url_for(WorkerKey("w", 3)) == "http://all"
    assert targets.url_for(WorkerKey("v", 0)) is None and targets.all_keys() == [("w", 1), ("v", 2), ("w", 0)]
    targets.seen([WorkerKey("w", 1), WorkerKey("w", 3)])
    assert targets.all_keys() == [("w", 1), ("v", 2), ("w", 3)]  # rank 1 has its own URL
    with pytest.raises(ValueError, match="given twice"):
        Targets([WorkerUrl("w", None, "http://a"), WorkerUrl("w", None, "http://b")])
    names = ModelNames(clock=lambda: 0.0)
    assert names.should_ask("m") and names.lora_name("m") is None  # nothing listed yet: a base model
    names.learn([{"id": "m"}, {"id": "ad", "parent": "m"}])
    assert (names.lora_name("m"), names.lora_name("ad"), names.lora_name("other")) == (None, "ad", "other")
    assert not names.should_ask("ad")
