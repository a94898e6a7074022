"""The /score body's fast decoders (issue 30) accept only what the pydantic ScoreRequest accepts,
read the same values, and give the same answers: differential tests over edge cases and
generated bodies, the compiled JSON id reader against its pure-Python twin, and a RouterService
fed by a real publisher answering every body alike on the compiled and the pure-Python path."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kvevents import native
from kvevents.consumers.service.core import RouterService, ScoreRequest
from kvevents.consumers.service.score_body import MAX_NAME_CHARS, decode_fast, decode_packed, pack_json_ids_py
from kvevents.hashing import Namespace, pack_tokens
from kvevents.sim.worker import Request, SimWorker
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source

EPH = "tcp://127.0.0.1:*"
compiled = pytest.mark.skipif(
    not native.active(), reason="kvevents.native._speedups not built, or KVEVENTS_PURE_PYTHON set"
)

EDGE = [
    b'{"tokens":[1,2]}',
    b'{"tokens":[]}',
    b'{"tokens":[1.0]}',
    b'{"tokens":[1e2]}',
    b'{"tokens":[true]}',
    b'{"tokens":[-1]}',
    b'{"tokens":[-0]}',
    b'{"tokens":[01]}',
    b'{"tokens":[1,]}',
    b'{"tokens":[4294967295]}',
    b'{"tokens":[4294967296]}',
    b'{"tokens":[99999999999999999999999]}',
    b'{"tokens":null}',
    b'{"tokens":"123"}',
    b"{}",
    b"[1]",
    b'{"tokens":[1]}x',
    b' \n{"tokens" : [ 1 ,\t2 ] }\r\n',
    b'\xef\xbb\xbf{"tokens":[1]}',
    b'{"tokens":[1],"tokens":[2]}',
    b'{"tokens":[1],"x":1}',
    b'{"tokens":[1],"top_k":1.0}',
    b'{"tokens":[1],"top_k":"2"}',
    b'{"tokens":[1],"top_k":0}',
    b'{"tokens":[1],"top_k":99999999999999999999999}',
    b'{"tokens":[1],"explain":1}',
    b'{"tokens":[1],"explain":true}',
    b'{"tokens":[1],"top_k":null,"explain":false,"cache_salt":null,"lora_name":null}',
    b'{"tokens":[1],"cache_salt":"\\ud800"}',
    b'{"tokens":[1],"cache_salt":"a\\u0000b\\u00e9"}',
    b'{"tokens":[1],"cache_salt":"\xff"}',
    b'{"tokens":[1],"lora_name":"' + "\U0001f600".encode() * MAX_NAME_CHARS + b'"}',
    b'{"tokens":[1],"lora_name":"' + "\U0001f600".encode() * (MAX_NAME_CHARS + 1) + b'"}',
]


def _pydantic(body: bytes) -> tuple | None:
    try:
        r = ScoreRequest.model_validate_json(body)
    except ValidationError:
        return None
    return (r.tokens, r.cache_salt, r.lora_name, r.top_k, r.explain)


def _fast(body: bytes) -> tuple | None:
    r = decode_fast(body)
    return None if r is None else (r.tokens, r.cache_salt, r.lora_name, r.top_k, r.explain)


def _packed(body: bytes) -> tuple | None:
    got = decode_packed(body)
    if got is None:
        return None
    head, packed = got
    ids = [int.from_bytes(packed[i : i + 4], "little") for i in range(0, len(packed), 4)]
    return (ids, head.cache_salt, head.lora_name, head.top_k, head.explain)


def _agree(body: bytes) -> None:
    want = _pydantic(body)
    for name, got in (("decode_fast", _fast(body)), ("decode_packed", _packed(body))):
        assert got is None or got == want, (name, body[:80], got, want)


@pytest.mark.parametrize("body", EDGE, ids=range(len(EDGE)))
def test_fast_decoders_accept_only_what_score_request_accepts(body: bytes) -> None:
    _agree(body)


def test_the_usual_body_takes_the_fast_path() -> None:
    body = b'{"tokens":[3,1,4,1,5],"cache_salt":"t","lora_name":"a","top_k":2}'
    assert _fast(body) == _pydantic(body) == ([3, 1, 4, 1, 5], "t", "a", 2, False)
    if native.active():
        assert _packed(body) == _pydantic(body)
        assert _packed(b'{"tokens":[1],"explain":true}') == ([1], None, None, None, True)  # hashes from packed ids


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.lists(st.integers(-5, 2**33), max_size=6),
)


@given(
    st.dictionaries(
        st.sampled_from(["tokens", "cache_salt", "lora_name", "top_k", "explain", "other"]), FIELD_VALUES, max_size=6
    )
)
def test_generated_bodies_agree_with_score_request(obj: dict) -> None:
    _agree(json.dumps(obj).encode())


def _render(ids: list[int], ws: list[str]) -> bytes:
    """ids as a JSON array with the whitespace of `ws` (cycled) around every bracket and comma."""
    gap = itertools.cycle(ws)
    inner = "".join(f"{next(gap)},{next(gap)}{i}" for i in ids[1:])
    head = str(ids[0]) if ids else ""
    return f"{next(gap)}[{next(gap)}{head}{inner}{next(gap)}]{next(gap)}".encode()


@compiled
@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
    st.lists(st.sampled_from(["", " ", "\t", "\n", "\r", "  "]), min_size=1),
)
def test_json_id_reader_matches_its_twin_on_arrays(ids: list[int], ws: list[str]) -> None:
    text = _render(ids, ws)
    assert native.pack_json_u32(text) == pack_json_ids_py(text) == pack_tokens(ids)


@compiled
@given(st.binary(max_size=40) | st.text(alphabet='[]0123456789,-+.eE \t\n\rx"', max_size=30).map(str.encode))
def test_json_id_reader_matches_its_twin_on_any_text(text: bytes) -> None:
    got = native.pack_json_u32(text)
    assert got == pack_json_ids_py(text)
    if got is not None:  # what it reads is what JSON says
        assert list(json.loads(text)) == [int.from_bytes(got[i : i + 4], "little") for i in range(0, len(got), 4)]


@compiled
def test_json_id_reader_refuses_non_buffers() -> None:
    with pytest.raises(ValueError):
        native.pack_json_u32("[1]")


@pytest.fixture(scope="module")
def service():
    """One sim worker publishing on loopback (one worker: no random tie-break between calls)."""
    worker = SimWorker("w0", page_size=16, capacity_pages=400)
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, bind=True, heartbeat_interval_s=0.05)
    svc = RouterService([Source(pub.endpoint, pub.replay_endpoint, "w0")], page_size=16, seed=0)
    svc.start()
    try:
        pub.publish(worker.take_events())
        doc = list(range(700, 700 + 40 * 16 + 5))
        for salt in (None, "tenant-a"):
            worker.serve(Request(doc[: 24 * 16], Namespace(cache_salt=salt)))
            pub.publish(worker.take_events())
        deadline = time.monotonic() + 10
        while (svc.applied_seq("w0") or 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (svc.applied_seq("w0") or 0) >= 2, "the router did not apply the published batches"
        yield svc, doc
    finally:
        svc.stop()
        pub.close(0.2)


def test_handle_score_answers_alike_on_every_path(service) -> None:
    svc, doc = service
    bodies = [
        {"tokens": doc},
        {"tokens": doc, "cache_salt": "tenant-a"},
        {"tokens": doc[:100], "top_k": 1},
        {"tokens": doc[:15]},
        {"tokens": []},
        {"tokens": doc, "explain": True},
        {"tokens": doc, "lora_name": "lora-a"},
        {"tokens": doc, "top_k": "1"},
        {"tokens": [1, -1]},
        {"tokens": doc, "extra": 1},
    ]
    for body in bodies:  # route false: a routing decision would credit the next answer with predicted pages
        raw = json.dumps({**body, "route": False}).encode()
        fast = svc.handle_score(raw)
        with native.python_only():
            slow = svc.handle_score(raw)
        assert fast == slow, body
    status, out = svc.handle_score(json.dumps({"tokens": doc}).encode())
    assert status == 200 and out["pages"] == len(doc) // 16 and out["workers"][0]["matched_pages"] == 24
    status, out = svc.handle_score(json.dumps({"tokens": doc, "cache_salt": "tenant-a"}).encode())
    assert status == 200 and out["workers"][0]["matched_pages"] == 24
    status, out = svc.handle_score(b'{"tokens":[1,-1]}')
    assert status == 400 and "tokens.1" in out["error"]
