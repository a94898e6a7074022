"""The page store under kvevents' SGLang HiCache backend, without SGLang (kvevents/plugins/hicache_store.py,
hicache_metrics.py, and hicache.py's options): real files in tmp dirs, a real metrics server on
127.0.0.1. Inside SGLang itself the backend is tested by tests/engines/test_sglang_hicache.py."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sys
import threading
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvevents.hashing import Namespace, storage_hashes
from kvevents.plugins import STORAGE_BACKENDS
from kvevents.plugins import hicache as backend
from kvevents.plugins.hicache_metrics import HICACHE_METRICS, MetricsServer
from kvevents.plugins.hicache_store import STORE_COUNTERS, HiCachePageStore, StorageScope

PAGE = 4
TOKENS = list(range(1, 4 * PAGE + 1))
KEYS = storage_hashes(TOKENS, PAGE, Namespace("lora-a"))  # what SGLang names these four pages


def page(i: int, size: int = 64) -> bytes:
    return bytes((i * 31 + j) % 256 for j in range(size))


@pytest.fixture
def store(tmp_path: Path) -> HiCachePageStore:
    return HiCachePageStore(tmp_path, StorageScope(model="m"), fsync=False)


def _stats(s: HiCachePageStore, *names: str) -> tuple[int, ...]:
    st = s.stats()
    return tuple(st[n] for n in names)


def test_round_trip_by_storage_key(store: HiCachePageStore) -> None:
    for i, key in enumerate(KEYS):
        assert store.put(key, page(i))
    assert [store.get(k) for k in KEYS] == [page(i) for i in range(4)]
    buf = bytearray(64)
    assert store.get_into(KEYS[2], memoryview(buf)) and bytes(buf) == page(2)
    assert _stats(store, "pages", "writes", "hits", "misses") == (4, 4, 5, 0)


def test_namespaces_never_share_a_page(store: HiCachePageStore) -> None:
    """The storage keys carry the namespace: base and salted keys of the same tokens find nothing."""
    for i, key in enumerate(KEYS):
        store.put(key, page(i))
    for ns in (Namespace(), Namespace(cache_salt="tenant-1"), Namespace("lora-b")):
        assert store.batch_exists(storage_hashes(TOKENS, PAGE, ns)) == 0


def test_the_header_binds_scope_and_key(tmp_path: Path, store: HiCachePageStore) -> None:
    store.put(KEYS[0], page(0))
    raw = store.path_for(KEYS[0]).read_bytes()
    fk = store.file_key(KEYS[0])
    assert fk is not None and bytes.fromhex(fk) in raw  # the header names (scope, storage key)
    # the same key on another TP rank is another page: a file copied across ranks is never served
    rank1 = HiCachePageStore(tmp_path, StorageScope(model="m", tp=(1, 2)), fsync=False)
    target = rank1.path_for(KEYS[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(raw)
    assert not rank1.exists(KEYS[0]) and rank1.get(KEYS[0]) is None
    assert _stats(rank1, "misplaced", "misses", "hits") == (1, 1, 0)
    assert not target.exists()  # dropped: the next write repairs it
    assert store.get(KEYS[0]) == page(0)  # the original is untouched


def test_a_swapped_file_is_a_miss(store: HiCachePageStore) -> None:
    store.put(KEYS[0], page(0))
    store.put(KEYS[1], page(1))
    a, b = store.path_for(KEYS[0]), store.path_for(KEYS[1])
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(raw_b)
    b.write_bytes(raw_a)
    assert store.batch_exists(KEYS[:2]) == 0  # the header of page 0's file names page 1
    assert store.get(KEYS[1]) is None
    assert _stats(store, "misplaced", "hits", "misses") == (2, 0, 1)
    assert store.put(KEYS[0], page(0)) and store.get(KEYS[0]) == page(0)  # rewritten, served again


def test_a_corrupt_page_is_a_counted_miss(store: HiCachePageStore) -> None:
    store.put(KEYS[0], page(0))
    path = store.path_for(KEYS[0])
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))
    assert store.exists(KEYS[0])  # the header is fine: exists() does not read the payload
    buf = bytearray(b"\xaa" * 64)
    assert not store.get_into(KEYS[0], memoryview(buf)) and buf == bytearray(b"\xaa" * 64)  # untouched
    assert _stats(store, "corrupt", "misses", "hits") == (1, 1, 0)
    assert not path.exists() and not store.exists(KEYS[0])
    store.put(KEYS[0], page(0))
    path.write_bytes(path.read_bytes()[:-3])  # truncated: exists() already sees it
    assert not store.exists(KEYS[0]) and store.stats()["corrupt"] == 2


def test_batch_exists_counts_the_consecutive_prefix(store: HiCachePageStore) -> None:
    for i in (0, 1, 3):
        store.put(KEYS[i], page(i))
    assert store.batch_exists(KEYS) == 2  # page 2 is missing: page 3 does not count
    assert store.batch_exists(KEYS[3:]) == 1
    assert store.batch_exists(KEYS[2:]) == 0
    assert store.batch_exists([]) == 0
    assert _stats(store, "exists_hits", "exists_misses") == (3, 2)


def test_a_page_already_stored_is_not_rewritten(store: HiCachePageStore) -> None:
    assert store.put(KEYS[0], page(0)) and store.put(KEYS[0], page(0))
    assert _stats(store, "writes", "write_skipped") == (1, 1)


def test_a_page_of_another_size_is_a_miss(store: HiCachePageStore) -> None:
    store.put(KEYS[0], page(0, 64))
    buf = bytearray(32)
    assert not store.get_into(KEYS[0], memoryview(buf)) and buf == bytearray(32)
    assert store.get_sized(KEYS[0], 64) == page(0, 64)
    assert _stats(store, "size_mismatch", "misses", "hits") == (1, 1, 1)


@pytest.mark.parametrize("key", ["", None, 7, b"ab"])
def test_bad_keys_are_counted_misses(store: HiCachePageStore, key: object) -> None:
    assert store.get(key) is None  # type: ignore[arg-type]
    assert not store.put(key, b"x")  # type: ignore[arg-type]
    assert not store.exists(key) and store.batch_exists([key]) == 0  # type: ignore[arg-type,list-item]
    assert store.stats()["bad_keys"] == 4 and store.stats()["pages"] == 0


def test_an_unwritable_store_refuses_the_page(store: HiCachePageStore) -> None:
    blocker = store.path_for(KEYS[0])
    blocker.mkdir(parents=True)  # a directory where the page file goes
    assert not store.put(KEYS[0], page(0))
    assert store.stats()["write_errors"] == 1


def test_clear_removes_only_this_scope(tmp_path: Path, store: HiCachePageStore) -> None:
    other = HiCachePageStore(tmp_path, StorageScope(model="other"), fsync=False)
    for s in (store, other):
        s.put(KEYS[0], page(0))
        s.put(KEYS[1], page(1))
    assert store.clear() == 2 and store.stats()["pages"] == 0
    assert other.batch_exists(KEYS[:2]) == 2


def test_counters_hold_under_threads(store: HiCachePageStore) -> None:
    for i, key in enumerate(KEYS):
        store.put(key, page(i))

    def reader() -> None:
        for _ in range(50):
            for key in KEYS:
                assert store.get(key) is not None

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.stats()["hits"] == 4 * 50 * 4


def test_scope_from_sglang_config() -> None:
    cfg = SimpleNamespace(
        tp_rank=1, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, is_page_first_layout=True, model_name="Org/Model-8B",
    )  # fmt: skip
    scope = StorageScope.from_config(cfg)
    assert scope.tp == (1, 2) and scope.page_first and scope.rank_index == 1
    assert scope.dirname().startswith("Org-Model-8B.tp1of2.")
    # MLA pages are the same on every rank: one directory for all of them
    mla = [
        StorageScope.from_config(SimpleNamespace(**{**vars(cfg), "tp_rank": r, "is_mla_model": True})) for r in (0, 1)
    ]
    assert mla[0].dirname() == mla[1].dirname() and "tp-all" in mla[0].dirname()
    assert StorageScope(model="m", tp=(0, 2)).dirname() != StorageScope(model="m", tp=(1, 2)).dirname()
    assert StorageScope(model="m").dirname() != StorageScope(model="m", page_first=True).dirname()


@pytest.mark.parametrize("tp", [(2, 2), (-1, 2), (0, 0), (True, 1)])
def test_scope_rejects_bad_ranks(tp: tuple) -> None:
    with pytest.raises(ValueError, match="tp"):
        StorageScope(model="m", tp=tp)


def test_backend_options(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="needs a directory"):
        backend.backend_options({}, env={})
    assert backend.backend_options({}, env={backend.ENV_DIR: "/d"}).path == Path("/d")
    opts = backend.backend_options({"path": "/p", "fsync": False, "metrics_port": 9400, "interface_v1": 1}, env={})
    assert (opts.path, opts.fsync, opts.metrics_port) == (Path("/p"), False, 9400)
    with caplog.at_level(logging.WARNING, logger="kvevents.plugins.hicache"):
        backend.backend_options({"path": "/p", "colour": "blue"}, env={})
    assert "colour" in caplog.text
    for bad in ({"fsync": "yes"}, {"metrics_port": 70000}, {"metrics_port": True}, {"metrics_addr": ""}):
        with pytest.raises(ValueError):
            backend.backend_options({"path": "/p", **bad}, env={})


def test_module_map_and_extra_config() -> None:
    entry = STORAGE_BACKENDS["sglang"]
    assert (entry.module, entry.class_name, entry.backend_name) == (
        backend.__name__,
        backend.CLASS_NAME,
        backend.BACKEND_NAME,
    )
    cfg = json.loads(json.dumps(backend.extra_config("/pages", fsync=False)))  # what the flag takes
    assert cfg == {
        "backend_name": "kvevents",
        "module_path": "kvevents.plugins.hicache",
        "class_name": "KVEventsHiCacheStorage",
        "path": "/pages",
        "fsync": False,
    }


def test_importable_without_sglang_and_the_class_needs_it() -> None:
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here: this checks the backend without it")
    assert "sglang" not in sys.modules
    with pytest.raises(ImportError):
        getattr(backend, backend.CLASS_NAME)  # what SGLang's factory does: builds the class, needs SGLang
    with pytest.raises(AttributeError):
        backend.NoSuchClass  # noqa: B018


def test_metric_names_cover_the_counters_once() -> None:
    assert set(HICACHE_METRICS) == {"pages", "corrupt", "misplaced", "writes", *STORE_COUNTERS}
    names = [name for name, _, _ in HICACHE_METRICS.values()]
    assert len(set(names)) == len(names)


def test_metrics_server_serves_stats(store: HiCachePageStore) -> None:
    store.put(KEYS[0], page(0))
    store.get(KEYS[0])
    store.get(KEYS[1])
    server = MetricsServer(store.stats, 0, labels={"scope": store.scope.dirname()})
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        server.close()
    got = {m[0]: float(m[1]) for m in re.findall(r"^(kvevents_hicache_\w+)\{[^}]*\} (\S+)$", text, re.M)}
    want = {HICACHE_METRICS[k][0]: float(v) for k, v in store.stats().items()}
    assert got == want and got["kvevents_hicache_hits_total"] == 1 and got["kvevents_hicache_misses_total"] == 1
    server.close()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=2)
