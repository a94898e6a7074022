"""The table layout the C and consumers/table.py share (kvevents/native/layout.py), and the switch's check.

The extension exports its constants; an extension built for another layout is refused at import with
one line on stderr, and the pure-Python twins run (checked with a stand-in extension whose layout()
lies, so the product is not edited). The Python table is checked against the layout constants too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvevents import native
from kvevents.consumers import copies, lookup
from kvevents.consumers.table import VACANT, HashTable
from kvevents.native import layout

REPO = Path(__file__).resolve().parents[2]
needs_c = pytest.mark.skipif(not native.HAVE_C, reason="kvevents.native._speedups not built")


@needs_c
def test_the_extension_exports_the_python_tables_layout():
    from kvevents.native import _speedups

    assert _speedups.layout() == dict(layout.TABLE_LAYOUT)
    assert layout.mismatch(_speedups.layout()) is None and native.refusal(_speedups.layout()) is None
    assert native.REFUSED is None


def test_a_deliberately_wrong_constant_is_named_in_one_line():
    wrong = {**layout.TABLE_LAYOUT, "SLOTS": 16, "CVIEW": layout.CVIEW[::-1]}
    del wrong["WORD"]
    wrong["EXTRA"] = 1
    msg = native.refusal(wrong)
    assert msg is not None and "\n" not in msg
    assert msg.startswith("kvevents: the C extension was built for another table layout (")
    assert "SLOTS: C 16, Python 8" in msg and "WORD: C 'missing', Python 32" in msg
    assert "EXTRA: C 1, Python 'missing'" in msg and "CVIEW: C ('pmeta'," in msg
    assert "MIX" not in msg and "TOMB" not in msg  # only what differs
    assert msg.endswith("the pure-Python fallback is in use (rebuild it: python3 setup.py build_ext --inplace)")
    assert native.refusal(dict(layout.TABLE_LAYOUT)) is None


# A stand-in for the built extension: every function is the real one, but layout() reports 16-slot
# buckets. Loaded under the extension's name before kvevents is imported, so the switch sees it.
_LYING_EXTENSION = """
import importlib.machinery, importlib.util, sys, types
path = sys.argv[1]
spec = importlib.util.spec_from_file_location(
    "kvevents.native._speedups", path, loader=importlib.machinery.ExtensionFileLoader("kvevents.native._speedups", path)
)
real = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)
fake = types.ModuleType("kvevents.native._speedups")
fake.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
fake.layout = lambda: {**real.layout(), "SLOTS": 16}
sys.modules["kvevents.native._speedups"] = fake

import numpy as np
from kvevents import native, Namespace, event_hashes, to_int64
from kvevents.consumers.indexer import BlockIndex
from kvevents.events import BlockStored, KVEventBatch

assert native.HAVE_C and not native.active(), native.describe()
ns = Namespace(extra_key="lora-a", cache_salt="tenant-a")
got = [to_int64(h) for h in event_hashes([0, 1, 151643, 2147483647, 7, 8, 9, 10], 4, ns)]
assert got == [6805968312002891368, 7462971412614245603], got  # golden case C06
idx = BlockIndex()
idx.apply("w", KVEventBatch(0.0, [BlockStored([1, 2, 3], None, [], 16, None, "GPU", None)], 0))
assert idx.prefix_match(np.array([1, 2, 9], np.int64)).workers[0].pages == 2
print(native.describe())
"""


@pytest.mark.subprocess
@needs_c
def test_an_extension_built_for_another_layout_is_refused_and_the_python_twins_run():
    from kvevents.native import _speedups

    env = {k: v for k, v in os.environ.items() if k != "KVEVENTS_PURE_PYTHON"}
    env["PYTHONPATH"] = str(REPO)
    run = subprocess.run(
        [sys.executable, "-c", _LYING_EXTENSION, _speedups.__file__],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "speedups: pure Python (C extension refused: built for another table layout)"
    said = run.stderr.strip().splitlines()
    assert len(said) == 1, said
    assert said[0].startswith("kvevents: the C extension was built for another table layout (SLOTS: C 16, Python 8)")


def test_the_python_table_follows_the_layout():
    t = HashTable()
    t.reserve(40)
    keys = list(range(1, 41))
    t.set_bits_each(keys, 1, 0b100, 7)
    t.set_bits_each(keys[:2], 9, 0b1, None)  # keys 1 and 2: a second column, so a pool record
    view = dict(zip(layout.CVIEW, t.cview()))
    assert len(t.cview()) == len(layout.CVIEW)
    assert view["vacant"] == t.vacant == VACANT and view["spill"] is t.spill
    assert view["keys"].obj is t.keys and view["state"].obj is t.state and view["parent"].obj is t.parent
    assert view["pool"].obj is t.pool.words and view["pmeta"].obj is t.pool.meta
    assert view["overflow"].nbytes == t.capacity // layout.SLOTS
    assert view["nshift"] == 64 - (t.capacity // layout.SLOTS).bit_length() + 1
    assert len(t.rows) == t.capacity + layout.EXTRA_ROWS and not t.rows[t.capacity :].any()
    assert view["rows"].nbytes == (t.capacity + layout.EXTRA_ROWS) * 8
    for k in keys:
        s = t.find1(k)
        home = ((k * layout.MIX) % 2**64) >> view["nshift"]
        assert s // layout.SLOTS == home or t.spill.get(k) == s  # in its home bucket, or noted as spilled
        assert t.state[s] == layout.LIVE | layout.HAS_PARENT
        r = int(t.rows[s])
        if k > 2:
            assert r == 1 << 32 | 0b100  # inline: column 1, the bits
        else:  # one record for both (the same holders): header (1 share, length 2, class 0), then the pairs
            o = r & ((1 << layout.ROW_CLS_SHIFT) - 1)
            assert r >> layout.ROW_CLS_SHIFT == 1 << 7 | 0  # the ref bit, class 0
            assert t.pool.words[o] == 1 << layout.REC_SHARES_SHIFT | 2 << 8 and r == int(t.rows[t.find1(1)])
            assert t.pool.words[o + 1 : o + 3].tolist() == [1 << 32 | 0b100, 9 << 32 | 0b1]
    assert t.pool.meta[layout.PMETA_IN_USE] == layout.POOL_MIN_WORDS
    assert t.pool.meta[layout.PMETA_TOP] == 1 + layout.POOL_MIN_WORDS
    assert t.state[t.keys == VACANT].tolist() == [layout.EMPTY] * int((t.keys == VACANT).sum())
    t.clear_bit(t.find1(5), 1, 0b100)
    assert t.state[t.keys == VACANT].tolist().count(layout.TOMB) == 1
    words = t.state.view(np.uint64) & np.uint64(layout.LIVE_BYTES)  # the LIVE bit of each slot, 8 a word
    assert int(np.unpackbits(words.view(np.uint8)).sum()) == t.live == 39


def test_the_consumers_word_is_the_layouts():
    assert copies.WORD == lookup.WORD == layout.WORD
