"""Packaging habits: the engine-side publisher stays light; one version."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

import kvevents
from tests.helpers.repo import REPO


@pytest.mark.subprocess
def test_embedding_the_publisher_imports_no_cli_consumer_or_metrics_stack():
    code = (
        "import sys\n"
        "from kvevents.zeromq.publisher import Publisher, PublisherConfig\n"
        "heavy = ('numpy', 'rich', 'typer', 'prometheus_client', 'fastapi', 'uvicorn', 'nats', 'cbor2', 'consumers')\n"
        "names = {m.split('.')[0] for m in sys.modules} | {m.split('.')[1] for m in sys.modules if m.startswith('kvevents.')}\n"
        "print(sorted(names & set(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_version_is_defined_once():
    assert version("kvevents") == kvevents.__version__


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_build_without_a_compiler_installs_the_fallback_and_says_so(tmp_path):
    """No working C compiler (CC=false): the build still succeeds, prints one line that the
    pure-Python fallback is in use, leaves no extension, and that tree hashes by the contract."""
    import os
    import shutil

    repo = REPO
    files = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        src = repo / name
        if src.is_file() and not src.is_symlink() and not name.endswith(".so"):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tmp_path / name)
        elif src.is_symlink():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), tmp_path / name)
    env = dict(os.environ, CC="false", LDSHARED="false")
    env.pop("KVEVENTS_NO_EXT", None)
    built = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr[-2000:]
    said = [ln for ln in (built.stdout + built.stderr).splitlines() if "fallback" in ln]
    assert len(said) == 1 and said[0].startswith("kvevents: C extension not built"), said
    assert not list((tmp_path / "kvevents").glob("native/_speedups*.so"))
    code = (  # (without the dev install's editable finder, which would supply the working tree's build)
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable__')]\n"
        "import kvevents, kvevents.native as s\n"
        "from kvevents import Namespace, event_hashes, to_int64\n"
        "ns = Namespace(extra_key='lora-a', cache_salt='tenant-a')\n"
        "got = [to_int64(h) for h in event_hashes([0, 1, 151643, 2147483647, 7, 8, 9, 10], 4, ns)]\n"
        "assert got == [6805968312002891368, 7462971412614245603], got  # golden case C06\n"
        f"assert kvevents.__file__.startswith({str(tmp_path)!r}), kvevents.__file__\n"
        "print(s.describe())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=dict(env, PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "speedups: pure Python (C extension not built)"
