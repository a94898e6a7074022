"""LiveView (the publisher's snapshot view): the optimised apply against a plain reference model."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvevents.zeromq.view import LiveView, snapshot_batches


class _Reference:
    """The view's rules, one hash at a time: the first copy of (medium, hash) is live, later copies
    are extra (kept in order); a remove drops the newest extra copy, else the live one, else nothing."""

    def __init__(self) -> None:
        self.media: dict = {}
        self.extra: dict = {}
        self.page_size = None

    def apply(self, events) -> None:
        for ev in events:
            if isinstance(ev, AllBlocksCleared):
                for m in self.media.values():
                    m.clear()
                self.extra.clear()
                continue
            m = self.media.setdefault(ev.medium, {})
            for h in ev.block_hashes:
                key = (ev.medium, h)
                if isinstance(ev, BlockStored):
                    if h in m:
                        self.extra.setdefault(key, []).append(ev)
                    else:
                        m[h] = ev
                elif self.extra.get(key):
                    self.extra[key].pop()
                    if not self.extra[key]:
                        del self.extra[key]
                else:
                    m.pop(h, None)
            if isinstance(ev, BlockStored):
                self.page_size = ev.block_size


def _state(media, extra) -> tuple:
    """Live copies in dict order (the snapshot's order) and extra copies, events by identity."""
    live = [(md, [(h, id(ev)) for h, ev in m.items()]) for md, m in media if m]
    copies: dict = {}
    for md, h, ev in extra:
        copies.setdefault((md, h), []).append(id(ev))
    return live, copies


_medium = st.sampled_from(["GPU", "CPU_PINNED", None])
_hashes = st.lists(st.integers(-3, 5), max_size=4)  # few values: copies, repeats inside an event
_event = st.one_of(
    st.builds(
        lambda hs, md, bs, parent: BlockStored(hs, parent, [7] * (bs * len(hs)), bs, None, md, None),
        _hashes,
        _medium,
        st.integers(1, 3),
        st.one_of(st.none(), st.integers(-3, 5)),
    ),
    st.builds(BlockRemoved, _hashes, _medium),
    st.just(AllBlocksCleared()),
)
# single-page events weighted up: they take the unpacking fast path until a multi-page one is seen
_single = st.one_of(
    st.builds(lambda h, md: BlockStored([h], None, [7], 1, None, md, None), st.integers(-3, 5), _medium),
    st.builds(lambda h, md: BlockRemoved([h], md), st.integers(-3, 5), _medium),
)


@pytest.mark.slow
@settings(max_examples=300)
@given(st.lists(st.lists(st.one_of(_event, _single, _single), max_size=8), max_size=12))
def test_apply_matches_the_reference_model(batches):
    view, ref = LiveView(), _Reference()
    for events in batches:
        view.apply(events)
        ref.apply(events)
        frozen = view.freeze()
        ref_extra = [(md, h, ev) for (md, h), evs in ref.extra.items() for ev in evs]
        assert _state(frozen.media, frozen.extra) == _state(ref.media.items(), ref_extra)
        assert view.page_size == ref.page_size
        assert len(view) == len(frozen) == sum(map(len, ref.media.values())) + len(ref_extra)


def _copies(view: LiveView) -> Counter:
    frozen = view.freeze()
    return Counter([(md, h) for md, m in frozen.media for h in m] + [(md, h) for md, h, _ in frozen.extra])


@given(st.lists(st.lists(st.one_of(_event, _single), max_size=8), max_size=10))
def test_snapshot_rebuilds_the_same_copies(batches):
    view = LiveView()
    for events in batches:
        view.apply(events)
    rebuilt = LiveView()
    for events in snapshot_batches(view.freeze(), blocks_per_batch=3):
        rebuilt.apply(events)
    assert _copies(rebuilt) == _copies(view)


def test_events_are_kept_by_reference_and_copies_removed_newest_first():
    a = BlockStored([1, 2], None, [1, 1, 2, 2], 2, None, "GPU", None)
    b = BlockStored([1], None, [1, 1], 2, None, "GPU", None, cache_salt="b")
    c = BlockStored([1], None, [1, 1], 2, None, "GPU", None, cache_salt="c")
    v = LiveView()
    v.apply([a, b])  # a multi-page store first (the len() path), then single pages
    v.apply([c, BlockStored([9], None, [9], 1, None, "CPU_PINNED", None)])
    f = v.freeze()
    assert f.media[0][1][1] is a and [ev for _, _, ev in f.extra] == [b, c] and v.page_size == 1
    v.apply([BlockRemoved([1], "GPU")])
    assert [ev for _, _, ev in v.freeze().extra] == [b] and len(v) == 4
    v.apply([BlockRemoved([1, 1, 1, 2], "GPU"), BlockRemoved([9], "CPU_PINNED")])
    assert len(v) == 0
    v.apply([c, AllBlocksCleared(), b])
    assert _state(v.freeze().media, v.freeze().extra) == ([("GPU", [(1, id(b))])], {})


def test_a_remove_naming_its_adapter_takes_that_adapters_copy():
    """One hash stored under two adapters: a BlockRemoved with lora_name drops that adapter's copy,
    whichever of the two the view kept first; the snapshot rebuilds the other."""
    from kvevents.zeromq.view import LiveView, snapshot_batches

    for first, gone, kept in (("a", "a", "b"), ("a", "b", "a")):
        v = LiveView()
        second = "b" if first == "a" else "a"
        v.apply(
            [
                BlockStored([7], None, [1, 2], 2, None, "GPU", first),
                BlockStored([7], None, [1, 2], 2, None, "GPU", second),
            ]
        )
        v.apply([BlockRemoved([7], "GPU", gone)])
        evs = [e for batch in snapshot_batches(v.freeze()) for e in batch if isinstance(e, BlockStored)]
        assert [(e.block_hashes, e.lora_name) for e in evs] == [([7], kept)]
