"""Real `POST /score` bodies against the app's own OpenAPI document (GET /openapi.json): the 200
answers (plain, `explain`, `top_k`, no match) and a 400 validate, with JSON Schema 2020-12, against
the schemas the document names for them, strictly (a field the document does not name is an
error too). A live RouterService on port 0 fed by a real publisher on 127.0.0.1."""

from __future__ import annotations

import copy
import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from kvevents.consumers.service.core import RouterService
from kvevents.sim.worker import Request, SimWorker
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source
from tests.helpers.wait import wait_until

PAGE = 4
DOC = list(range(700, 700 + 5 * PAGE))


class Route:
    """A RouterService over HTTP that holds one worker's 5-page prefix."""

    def __init__(self) -> None:
        self.pub = Publisher(endpoint=EPH, replay_endpoint=EPH, bind=True, heartbeat_interval_s=0.1)
        self.service = RouterService([Source(self.pub.endpoint, self.pub.replay_endpoint, "w0")], page_size=PAGE)
        self.service.start()
        self.host, self.port = self.service.serve_http("127.0.0.1", 0)
        worker = SimWorker("w0", page_size=PAGE)
        worker.serve(Request(DOC))
        seq = self.pub.publish(worker.take_events())
        wait_until("the router to apply the prefix", lambda: (self.service.applied_seq("w0") or -1) >= seq)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
        try:
            conn.request(method, path, body, {"Content-Type": "application/json"} if body else {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def close(self) -> None:
        self.service.stop()
        self.pub.close(0.2)


@pytest.fixture(scope="module")
def route() -> Iterator[Route]:
    r = Route()
    yield r
    r.close()


@pytest.fixture(scope="module")
def openapi(route: Route) -> dict:
    status, doc = route.call("GET", "/openapi.json")
    assert status == 200
    return doc


def _strict(node: Any) -> Any:
    """The schema with every object schema closed: properties it does not name are errors."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def _validator(doc: dict, status: str) -> Draft202012Validator:
    """A validator of the /score response `status` as the document declares it ($refs resolved in it)."""
    declared = doc["paths"]["/score"]["post"]["responses"][status]["content"]["application/json"]["schema"]
    schema = {**copy.deepcopy(declared), "components": _strict(doc["components"])}
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _errors(v: Draft202012Validator, body: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(body)]


@pytest.mark.parametrize(
    "request_body",
    [
        {"tokens": DOC},
        {"tokens": DOC, "explain": True},
        {"tokens": DOC + [1, 2], "top_k": 1, "cache_salt": "t", "lora_name": None},
        {"tokens": list(range(5000, 5012))},  # no worker holds it: best is null
    ],
    ids=["plain", "explain", "top_k", "no-match"],
)
def test_a_real_score_body_validates_against_the_documented_model(route, openapi, request_body) -> None:
    status, body = route.call("POST", "/score", json.dumps(request_body).encode())
    assert status == 200, body
    assert _errors(_validator(openapi, "200"), body) == []
    assert body["page_size"] == PAGE and body["workers"][0]["worker"] == "w0"
    if request_body["tokens"] == DOC:
        assert body["best"] == "w0" and body["workers"][0]["matched_pages"] == 5
    if request_body.get("explain"):
        assert body["hashes"] and body["workers"][0]["pages_by_medium"] == {"GPU": 5}


def test_a_400_body_validates_against_the_documented_error_model(route, openapi) -> None:
    status, body = route.call("POST", "/score", b'{"tokens": "not a list"}')
    assert status == 400
    assert _errors(_validator(openapi, "400"), body) == [] and body["error"]


def test_the_strict_check_refuses_what_the_document_does_not_name(route, openapi) -> None:
    """The validator is not vacuous: an extra field, a missing one or a wrong type is reported."""
    _, body = route.call("POST", "/score", json.dumps({"tokens": DOC}).encode())
    v = _validator(openapi, "200")
    assert _errors(v, {**body, "surprise": 1})
    assert _errors(v, {k: x for k, x in body.items() if k != "best"})
    assert _errors(v, {**body, "workers": [{**body["workers"][0], "matched_pages": "5"}]})
