"""End to end: simulated engine workers -> Publisher -> Subscriber; state equals the cache's own view."""

from __future__ import annotations

import threading
from collections import Counter

from kvevents.cache import RadixCache
from kvevents.sim.worker import SimWorker, Workload
from kvevents.testing.zeromq import EPH, apply, collect, stored, view_counts
from kvevents.zeromq.publisher import Publisher, publish_steps
from kvevents.zeromq.subscriber import Delivery, Reset, Source, Subscriber


def _counts(state: dict) -> Counter:
    out: Counter = Counter()
    for (_medium, h), n in state.items():
        out[h] += n
    return out


def _run_until_marker(sub, pub, state, timeout=10.0):
    marker = pub.publish([])
    items = collect(sub, lambda it: any(d.seq >= marker for d in it if isinstance(d, Delivery)), timeout)
    for it in items:
        if isinstance(it, Reset):
            state.clear()
        else:
            apply(state, it.batch)
    return items


def test_sim_worker_stream_matches_cache_with_losses_and_restart():
    w = SimWorker("w0", page_size=4, capacity_pages=64)
    load = iter(Workload(3, page_size=4, system_prompt_pages=(1, 4), user_tokens=(4, 40), answer_tokens=(4, 40)))
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.05)
    sub = Subscriber([Source(pub.endpoint, pub.replay_endpoint, "w0")], request_timeout_s=0.5)
    state: dict = {}
    try:
        collect(sub, lambda it: bool(it))  # joined (heartbeat or replay)
        for i in range(300):
            if i == 100:
                pub.drop_live(7)  # healed by replay
            if i == 200:
                pub.force_drop(3)  # healed by snapshot
            if i == 250:
                w.restart()
            w.serve(next(load))
            publish_steps(w, pub)
        _run_until_marker(sub, pub, state)
        assert _counts(state) == +w.cache.published_copies()
        assert _counts(state) == _counts(view_counts(pub))
        c = sub.counters()
        assert c["replayed"] >= 7 and c["snapshots_applied"] >= 1
    finally:
        sub.stop()
        pub.close()


def test_radix_cache_on_events_wiring():
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    cache = RadixCache(4, on_events=pub.publish)
    try:
        cache.insert(list(range(16)))
        assert cache.flush_events() > 0
        assert pub.stats()["batches_published"] == 1
        assert _counts(view_counts(pub)) == +cache.published_copies()
    finally:
        pub.close()


def test_publish_from_many_threads_keeps_one_ordered_stream():
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    sub = Subscriber([Source(pub.endpoint, pub.replay_endpoint, "w")], request_timeout_s=0.5)
    try:
        joined: list = []
        while not joined:  # PUB drops until the subscription has arrived
            pub.publish([])
            joined = sub.poll(0.02)
        base = pub.stats()["next_seq"]
        seqs: list[int] = []
        lock = threading.Lock()

        def worker(k: int) -> None:
            for i in range(250):
                s = pub.publish([stored(k * 10000 + i)])
                with lock:
                    seqs.append(s)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(seqs) == list(range(base, base + 1000))
        state: dict = {}
        items = _run_until_marker(sub, pub, state)
        got = [d.seq for d in items if isinstance(d, Delivery)]
        assert got == list(range(got[0], got[-1] + 1)) and got[-1] == base + 1000
        assert len(state) == 1000
    finally:
        sub.stop()
        pub.close()
