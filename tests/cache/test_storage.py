"""The storage tier: page stores, namespace isolation, root-only prefetch, chunked offload."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvevents.cache import FileStore, MemoryStore, PageStore, RadixCache
from kvevents.events import BlockRemoved, BlockStored
from kvevents.hashing import Namespace, event_hashes, storage_hashes, to_int64
from kvevents.sim.worker import Request, SimWorker, expected_content

KINDS = [Namespace(), Namespace("key"), Namespace(None, "salt"), Namespace("key", "salt")]
KEY = "ab" * 32


# ---------------------------------------------------------------- stores
@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> PageStore:
    return MemoryStore() if request.param == "memory" else FileStore(tmp_path / "pages")


def test_store_round_trip(store: PageStore) -> None:
    assert isinstance(store, PageStore)
    assert store.get(KEY) is None and not store.contains(KEY)
    store.put(KEY, b"page-bytes")
    assert store.contains(KEY) and store.get(KEY) == b"page-bytes"
    store.put(KEY, b"other")
    assert store.get(KEY) == b"other"
    assert store.delete(KEY) and not store.delete(KEY)
    assert store.get(KEY) is None
    stats = store.stats()
    assert stats["hits"] == 2 and stats["misses"] == 2 and stats["writes"] == 2 and stats["corrupt"] == 0


@pytest.mark.parametrize("key", ["../" + "a" * 61, "A" * 64, "a" * 63, 5, "g" * 64])
def test_store_rejects_bad_keys(store: PageStore, key: object) -> None:
    with pytest.raises(ValueError, match="storage key"):
        store.put(key, b"x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.get(key)  # type: ignore[arg-type]


def test_memory_store_capacity_drops_lru() -> None:
    s = MemoryStore(capacity_pages=2)
    keys = [f"{i:02x}" * 32 for i in range(3)]
    s.put(keys[0], b"0")
    s.put(keys[1], b"1")
    s.get(keys[0])
    s.put(keys[2], b"2")
    assert s.keys() == [keys[0], keys[2]] and s.stats()["dropped"] == 1
    with pytest.raises(ValueError):
        MemoryStore(capacity_pages=0)


def test_file_store_is_atomic_and_checksummed(tmp_path: Path) -> None:
    s = FileStore(tmp_path)
    s.put(KEY, b"x" * 100)
    path = s.path_for(KEY)
    assert path.exists() and path.parent.parent == tmp_path
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    raw = path.read_bytes()
    assert len(raw) > 100 and raw.endswith(b"x" * 100)
    assert FileStore(tmp_path).get(KEY) == b"x" * 100  # survives a new instance (a restart)
    assert s.keys() == [KEY]


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:-1],  # truncated payload
        lambda raw: raw[:10],  # truncated header
        lambda raw: b"",  # empty file
        lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]),  # one flipped payload bit
        lambda raw: b"XXXX" + raw[4:],  # bad magic
        lambda raw: raw + b"extra",  # trailing garbage
    ],
)
def test_file_store_corrupt_page_is_a_counted_miss(tmp_path: Path, damage) -> None:
    s = FileStore(tmp_path)
    s.put(KEY, b"payload-" * 8)
    path = s.path_for(KEY)
    path.write_bytes(damage(path.read_bytes()))
    assert s.get(KEY) is None
    assert s.stats()["corrupt"] == 1 and s.stats()["misses"] == 1
    assert not path.exists()  # dropped, so the next write repairs it
    s.put(KEY, b"fresh")
    assert s.get(KEY) == b"fresh"


def test_corrupt_page_stops_prefetch_and_is_rewritten(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    cache = RadixCache(4, store=store)
    tokens = list(range(16))
    cache.insert(tokens, Namespace("k"))
    keys = storage_hashes(tokens, 4, Namespace("k"))
    p = store.path_for(keys[2])
    p.write_bytes(p.read_bytes()[:-3])
    fresh = RadixCache(4, store=store)
    assert fresh.prefetch(tokens, Namespace("k")) == 8  # pages 0, 1; page 2 is a counted miss
    assert store.stats()["corrupt"] == 1
    fresh.insert(tokens, Namespace("k"))  # write-through repairs the dropped page
    assert fresh.prefetch(tokens, Namespace("k")) == 16


def test_flipped_bit_is_not_a_storage_hit_and_write_through_repairs_it(tmp_path: Path) -> None:
    """contains() verifies the checksum: hit length never counts a page prefetch cannot serve."""
    store = FileStore(tmp_path)
    cache = RadixCache(4, store=store)
    tokens = list(range(16))
    cache.insert(tokens, Namespace("k"))
    p = store.path_for(storage_hashes(tokens, 4, Namespace("k"))[2])
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0x01  # a payload bit, not the header: the file keeps its length
    p.write_bytes(bytes(raw))
    fresh = RadixCache(4, store=store)
    assert fresh.storage_hit_length(tokens, Namespace("k")) == 8
    assert store.stats()["corrupt"] == 1
    fresh.insert(tokens, Namespace("k"))  # write-through rewrites the page it found missing
    assert fresh.storage_hit_length(tokens, Namespace("k")) == 16
    assert fresh.prefetch(tokens, Namespace("k")) == 16


@pytest.mark.parametrize("bad", [5, None])
def test_filestore_rejects_a_non_path(bad: object) -> None:
    with pytest.raises(ValueError, match="FileStore directory"):
        FileStore(bad)  # type: ignore[arg-type]


def test_filestore_rejects_a_file_as_directory(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="not a directory"):
        FileStore(f)


# ---------------------------------------------------------------- write-through and isolation
def test_write_through_survives_reset(store: PageStore) -> None:
    cache = RadixCache(4, store=store)
    tokens = list(range(10))  # two whole pages, the tail is never stored
    ns = Namespace("lora", "t")
    cache.insert(tokens, ns)
    keys = storage_hashes(tokens[:8], 4, ns)
    assert all(store.contains(k) for k in keys)
    # without a page_content callback a page's bytes are its packed tokens
    assert store.get(keys[0]) == b"".join(i.to_bytes(4, "little") for i in range(4))
    cache.reset()
    assert cache.num_pages == 0
    assert cache.storage_hit_length(tokens, ns) == 8
    assert cache.prefetch(tokens, ns) == 8


def test_three_way_isolation(store: PageStore) -> None:
    """Adapter A, base model and salt "tenant-a" share tokens but never pages (device or storage)."""
    ps = 16
    worker = SimWorker("w", page_size=ps, capacity_pages=64, store=store)
    prompt = [(i * 7919) % 30000 for i in range(10 * ps + 5)]
    lora = Request(prompt, Namespace("adapter-a"), "adapter-a")
    base = Request(prompt, Namespace())
    salted = Request(prompt, Namespace(None, "tenant-a"))

    first = worker.serve(lora)
    assert first.device_hit_tokens == 0 and first.storage_hit_tokens == 0
    worker.cache.evict(10**6)  # flushed from the device; pages stay in storage
    again = worker.serve(lora)
    assert again.device_hit_tokens == 0
    assert again.storage_hit_tokens > len(prompt) - 2 * ps and again.content_ok
    pages = worker.cache.prefetch_pages(prompt, lora.namespace)
    assert pages == expected_content(prompt, lora.namespace, ps)[: len(pages)]

    for req in (base, salted):
        worker.cache.evict(10**6)
        r1 = worker.serve(req)
        assert r1.device_hit_tokens == 0 and r1.storage_hit_tokens < ps and r1.content_ok
        worker.cache.evict(10**6)
        r2 = worker.serve(req)  # its own pages are in storage now
        assert r2.storage_hit_tokens == len(prompt) // ps * ps and r2.content_ok
        r3 = worker.serve(req)  # and on the device
        assert r3.device_hit_tokens == len(prompt) // ps * ps
    worker.cache.evict(10**6)
    assert worker.serve(lora).storage_hit_tokens == len(prompt) // ps * ps
    assert worker.content_errors == 0


def test_root_only_prefetch_finds_exactly_its_own_pages(store: PageStore) -> None:
    ps = 4
    tokens = list(range(100, 124))
    writer = RadixCache(ps, store=store)
    writer.insert(tokens, Namespace("a", "s"))
    writer.insert(tokens[:12], Namespace(None, "s"))
    reader = RadixCache(ps, store=store)  # empty device: every match is root-only
    assert reader.match_prefix(tokens, Namespace("a", "s")).num_tokens == 0
    assert reader.storage_hit_length(tokens, Namespace("a", "s")) == 24
    assert reader.storage_hit_length(tokens, Namespace(None, "s")) == 12
    assert reader.storage_hit_length(tokens, Namespace("a")) == 0
    assert reader.storage_hit_length(tokens, Namespace()) == 0
    assert reader.storage_hit_length(tokens, Namespace("b", "s")) == 0
    assert reader.prefetch(tokens, Namespace(None, "s")) == 12
    # with a device match, prefetch continues from the match's last storage hash
    reader.insert(tokens[:8], Namespace("a", "s"))
    m = reader.match_prefix(tokens, Namespace("a", "s"))
    assert m.num_tokens == 8
    assert reader.prefetch(tokens[8:], Namespace("a", "s"), prior=m.storage_hashes[-1]) == 16


@pytest.mark.parametrize("ns", KINDS, ids=lambda n: f"{n.extra_key}-{n.cache_salt}")
@pytest.mark.parametrize("chunk_pages", [1, 2, 3])
def test_chunked_offload_equals_whole_chain(ns: Namespace, chunk_pages: int) -> None:
    ps = 4
    tokens = list(range(7, 7 + 9 * ps))
    whole_s = storage_hashes(tokens, ps, ns)
    whole_e = event_hashes(tokens, ps, ns)
    store = MemoryStore()
    decoder = RadixCache(ps, store=store)
    chunked_s: list[str] = []
    chunked_e: list[str] = []
    step = chunk_pages * ps
    for off in range(0, len(tokens), step):
        chunk = tokens[off : off + step]
        chunked_s += decoder.offload(chunk, ns, prior=chunked_s[-1] if chunked_s else None)
        chunked_e += event_hashes(chunk, ps, ns, prior=chunked_e[-1] if chunked_e else None)
    assert chunked_s == whole_s and chunked_e == whole_e
    # the first chunk may also continue explicitly from the namespace seed
    from kvevents.hashing import storage_seed

    seed = storage_seed(ns)
    if seed is not None:
        assert storage_hashes(tokens[:ps], ps, Namespace(), prior=seed) == whole_s[:1]
    prefill = RadixCache(ps, store=store)
    assert prefill.storage_hit_length(tokens, ns) == len(tokens)
    for other in KINDS:
        if other != ns:
            assert prefill.storage_hit_length(tokens, other) == 0


# ---------------------------------------------------------------- storage events
def test_storage_events_off_by_default_and_on_when_asked() -> None:
    store = MemoryStore()
    quiet = RadixCache(4, store=store)
    quiet.take_events()
    quiet.insert(list(range(8)))
    assert [e.medium for e in quiet.take_events()] == ["GPU"]

    store2 = MemoryStore()
    cache = RadixCache(4, store=store2, storage_events=True)
    cache.take_events()
    ns = Namespace("k", "s")
    tokens = list(range(12))
    cache.insert(tokens[:8], ns, lora_name="k")
    cache.insert(tokens, ns, lora_name="k")
    evs = cache.take_events()
    pub = [to_int64(h) for h in event_hashes(tokens, 4, ns)]
    assert [(type(e).__name__, e.medium) for e in evs] == [
        ("BlockStored", "GPU"),
        ("BlockStored", "STORAGE"),
        ("BlockStored", "GPU"),
        ("BlockStored", "STORAGE"),
    ]
    assert evs[1].block_hashes == pub[:2] and evs[1].parent_block_hash is None
    assert evs[3].block_hashes == pub[2:] and evs[3].parent_block_hash == pub[1]
    assert evs[3].cache_salt == "s" and evs[3].lora_name == "k"
    # a device eviction does not touch storage; a re-insert of stored pages publishes no STORAGE store
    cache.evict(100)
    cache.insert(tokens, ns)
    evs = cache.take_events()
    assert [e.medium for e in evs] == ["GPU", "GPU"] and isinstance(evs[0], BlockRemoved)
    assert cache.storage_remove(tokens, ns) == 3
    (rm,) = cache.take_events()
    assert isinstance(rm, BlockRemoved) and rm.medium == "STORAGE" and rm.block_hashes == pub
    assert cache.storage_hit_length(tokens, ns) == 0
    assert all(isinstance(e, (BlockStored, BlockRemoved)) for e in evs)


def test_file_store_put_failure_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = FileStore(tmp_path, fsync=False)

    def boom(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    s.fsync = True
    with pytest.raises(OSError):
        s.put(KEY, b"data")
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_storage_pages_are_announced_again_after_a_reset() -> None:
    """AllBlocksCleared makes consumers forget every medium: stored pages are re-announced."""
    store = MemoryStore()
    cache = RadixCache(4, store=store, storage_events=True)
    tokens = list(range(8))
    cache.insert(tokens)
    cache.reset()
    cache.take_events()
    cache.insert(tokens)
    evs = cache.take_events()
    assert [(type(e).__name__, e.medium) for e in evs] == [("BlockStored", "GPU"), ("BlockStored", "STORAGE")]
    assert store.stats()["writes"] == 2  # announced again, not rewritten
    # a page deleted from the store that was never announced is not "removed" for consumers
    quiet = RadixCache(4, store=store)
    quiet.storage_remove(tokens, Namespace())
    assert quiet.take_events()[1:] == []


# ---------------------------------------------------------------- pages that cannot be served under the wrong key
OTHER = "cd" * 32


def test_a_valid_page_under_another_keys_name_is_a_counted_miss(tmp_path: Path) -> None:
    """A copy, rename or restore mix-up: the header binds the key, so the page is never served."""
    s = FileStore(tmp_path)
    s.put(KEY, b"bytes of page A")
    s.put(OTHER, b"bytes of page B")
    a, b = s.path_for(KEY), s.path_for(OTHER)
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(raw_b)  # swap the two files
    b.write_bytes(raw_a)
    assert s.get(KEY) is None and not s.contains(OTHER)
    st = s.stats()
    assert st["misplaced"] == 2 and st["hits"] == 0 and st["misses"] == 1
    assert not a.exists() and not b.exists()  # dropped, like a corrupt page: the next write repairs it
    s.put(KEY, b"bytes of page A")
    assert s.get(KEY) == b"bytes of page A"


def test_the_key_is_in_the_page_file(tmp_path: Path) -> None:
    s = FileStore(tmp_path)
    s.put(KEY, b"x")
    assert bytes.fromhex(KEY) in s.path_for(KEY).read_bytes()


def test_a_directory_at_a_page_path_is_a_miss(tmp_path: Path) -> None:
    s = FileStore(tmp_path)
    s.path_for(KEY).mkdir(parents=True)
    assert s.get(KEY) is None and not s.contains(KEY)
    assert s.stats()["misses"] == 1 and s.stats()["corrupt"] == 2
    assert s.keys() == [] and not s.delete(KEY)
    with pytest.raises(ValueError, match="not a page file"):
        s.put(KEY, b"x")
    # a file where the two-character fan-out directory should be: a miss too
    t = FileStore(tmp_path / "t")
    (tmp_path / "t" / KEY[:2]).write_bytes(b"x")
    assert t.get(KEY) is None and not t.delete(KEY)
