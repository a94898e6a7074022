"""The whole path in subprocesses (issue 26 part 3): `kvevents serve --workers 2 --http` gives every
simulated worker its own /v1/completions, `kvevents route --proxy --worker-url ...` sends each
request to the worker whose cache holds its prefix: the engine itself reports the cached tokens."""

from __future__ import annotations

import json
import time

import httpx
import pytest

pytestmark = pytest.mark.subprocess  # kvevents serve and route as a user runs them

from kvevents.testing.fleet import Fleet

PAGE = 16
DOC = list(range(7000, 7000 + 12 * PAGE))


@pytest.fixture(scope="module")
def fleet():
    with Fleet(2, route_args=("--seed", "0")) as f:
        yield f


def _complete(fleet: Fleet, body: dict) -> httpx.Response:
    return httpx.post(fleet.base + "/v1/completions", json=body, timeout=10)


def test_serve_prints_an_endpoint_per_worker(fleet: Fleet) -> None:
    assert [(w.name, w.dp_rank) for w in fleet.workers] == [("w0", 0), ("w1", 1)]
    assert len({w.url for w in fleet.workers}) == 2
    for w in fleet.workers:
        r = httpx.post(w.url + "/v1/completions", json={"prompt": [1, 2, 3]}, timeout=10)
        assert r.status_code == 200 and r.json()["system_fingerprint"] == f"kvevents-sim-{w.name}"


def test_a_repeated_prompt_goes_back_to_the_worker_that_cached_it(fleet: Fleet) -> None:
    first = _complete(fleet, {"model": "kvevents-sim", "prompt": DOC})
    assert first.status_code == 200, first.text
    worker, rank = first.headers["x-kvevents-worker"], int(first.headers["x-kvevents-dp-rank"])
    assert first.json()["system_fingerprint"] == f"kvevents-sim-{worker}" and rank == int(worker[1:])

    def routed() -> bool:  # the router learns the blocks from the worker's events, a moment later
        score = httpx.post(fleet.base + "/score", json={"tokens": DOC}, timeout=10).json()
        return score["best"] == worker and score["workers"][0]["matched_pages"] == len(DOC) // PAGE

    deadline = time.monotonic() + 10
    while not routed():
        assert time.monotonic() < deadline, "the router never learned the first request's blocks"
        time.sleep(0.02)
    for _ in range(3):
        again = _complete(fleet, {"model": "kvevents-sim", "prompt": DOC + [1, 2, 3]})
        assert again.headers["x-kvevents-worker"] == worker
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == len(DOC)
    body = {"prompt": DOC, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", fleet.base + "/v1/completions", json=body, timeout=10) as s:
        assert s.headers["content-type"].startswith("text/event-stream") and s.headers["x-kvevents-worker"] == worker
        events = [line[len("data: ") :] for line in s.iter_lines() if line.startswith("data: ")]
    usage = json.loads(events[-2])["usage"]
    assert events[-1] == "[DONE]" and usage["prompt_tokens_details"]["cached_tokens"] == len(DOC)
    rows = httpx.get(fleet.base + "/status.json", timeout=10).json()["proxy"]["workers"]
    mine = next(r for r in rows if r["worker"] == worker)
    assert mine["requests_total"] >= 5 and mine["answers"]["2xx"] >= 5 and mine["decode_blocks"] == 0
