"""Installed, not just checked out (issue 15): build the wheel, install it into a fresh virtual
environment and run `kvevents golden`, `kvevents demo` and a `serve` + `tail` pair from there.

The fresh venv is clean (no system site-packages) and sees the site directories of the interpreter
running the tests, after its own: the dependencies come from the environment the suite runs in (a
venv made for `pip install -e '.[test]'`, or the system Python), nothing is downloaded again, and
kvevents is imported from the wheel (the commands run from a temporary cwd; the test checks the
module path). `--system-site-packages` would not do: a venv made from a venv inherits the base
interpreter's packages, not the outer venv's. Building needs PyPI for the build backend
(setuptools>=68, isolated build): when pip cannot build (offline), the test is skipped;
KVEVENTS_SKIP_WHEEL=1 skips it too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ahead
from tests.helpers.repo import REPO

_IGNORE = shutil.ignore_patterns(
    ".git",
    "build",
    "dist",
    ".venv",
    "*.egg-info",
    "__pycache__",
    "*.so",
    ".hypothesis",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".benchmarks",
)

pytestmark = [
    pytest.mark.skipif(os.environ.get("KVEVENTS_SKIP_WHEEL") == "1", reason="KVEVENTS_SKIP_WHEEL=1"),
    pytest.mark.slow,
    pytest.mark.subprocess,
]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _build(root: Path) -> ahead.Outcome:
    """Build the wheel from this working tree and install it into a fresh venv under `root`:
    {"report": {"bin": its bin/}}, or {"skip": why} when pip cannot build offline."""
    src, wheels, env_dir = root / "src", root / "wheels", root / "venv"
    shutil.copytree(REPO, src, symlinks=True, ignore=_IGNORE)  # build out of tree: no build/ in the checkout
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "-w",
            str(wheels),
            "-q",
            "--disable-pip-version-check",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=root,
        env=_env(),
    )
    if built.returncode != 0:
        offline = any(
            w in built.stderr
            for w in (
                "No matching distribution",
                "Could not find a version",
                "NewConnection",
                "Temporary failure in name resolution",
                "Network is unreachable",
            )
        )
        if offline:
            return {"skip": f"pip cannot build the wheel offline: {built.stderr.strip().splitlines()[-1]}"}
        return {"fail": f"wheel build failed:\n{built.stderr[-3000:]}"}
    (wheel,) = wheels.glob("kvevents-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120, cwd=root)
    py = env_dir / "bin" / "python"
    _see_this_environment(py)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "--ignore-installed",
            "--no-index",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=root,
        env=_env(),
    )
    return {"report": {"bin": str(env_dir / "bin")}}


@dataclass(frozen=True)
class WheelVenv:
    """The module's slow set-up (about 8 s: an isolated build, a C compile, a venv), run ahead
    of its tests under xdist (tests/helpers/ahead.py)."""

    name: str = "wheel"

    def outcome(self, tmp: Path, started: object = None) -> ahead.Outcome:
        if os.environ.get("KVEVENTS_SKIP_WHEEL") == "1":  # the module's tests skip: nothing to build
            return {"skip": "KVEVENTS_SKIP_WHEEL=1"}
        return _build(tmp)


AHEAD = WheelVenv()


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    """A fresh venv with the wheel built from this working tree installed; returns its bin/."""
    outcome = ahead.take(pytestconfig, AHEAD) or AHEAD.outcome(tmp_path_factory.mktemp("wheel"))
    return Path(ahead.result(outcome)["bin"])


def _site_dirs() -> list[str]:
    """The site directories this interpreter imports installed packages from, in order (its venv's,
    the base's when the venv sees them, the user's): never the checkout on sys.path."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def _see_this_environment(py: Path) -> None:
    """Append this interpreter's site directories to the fresh venv's sys.path (a .pth of plain
    paths: their own .pth files, e.g. an editable kvevents, are not run)."""
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
    ).stdout.strip()
    dirs = _site_dirs()
    assert dirs, f"no site directory on {sys.path}"
    (Path(purelib) / "_kvevents_test_outer_env.pth").write_text("".join(f"{d}\n" for d in dirs))


def _kv(bin_dir: Path, *args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / "kvevents"), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_env()
    )


def test_the_venv_imports_kvevents_from_the_wheel_with_its_data(venv: Path, tmp_path: Path):
    code = (
        "import kvevents, kvevents.cli.golden as c; print(kvevents.__file__); print(c.default_golden_dir()); "
        "import kvevents.consumers as c2; print(c2.__file__); import importlib.util as u; "
        "print(u.find_spec('consumers') is None)"
    )
    out = subprocess.run(
        [str(venv / "python"), "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path, env=_env()
    ).stdout.split()
    site = str(venv.parent)
    assert out[3] == "True", out  # no generic top-level `consumers` package is installed
    out = out[:3]
    assert all(p.startswith(site) for p in out), out  # the wheel's copy, not the checkout
    golden = Path(out[1])
    for name in ("sglang-0.5.20.json", "vllm-0.33.json"):  # shipped byte for byte
        assert (golden / name).read_bytes() == (REPO / "schemas" / "golden" / name).read_bytes()
    schema = golden.parent / "kvevent-batch.schema.json"
    assert schema.read_bytes() == (REPO / "schemas" / "kvevent-batch.schema.json").read_bytes()


def test_golden_runs_from_the_installed_wheel(venv: Path, tmp_path: Path):
    r = _kv(venv, "golden", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "golden: sglang-0.5.20.json" in r.stdout and "golden: vllm-0.33.json" in r.stdout
    assert "golden items pass" in r.stdout.splitlines()[-1]


def test_demo_runs_from_the_installed_wheel(venv: Path, tmp_path: Path):
    r = _kv(venv, "demo", "--requests", "150", "--json", cwd=tmp_path, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["ok"] and all(result["checks"].values()) and result["requests"] > 0


def test_serve_and_tail_from_the_installed_wheel(venv: Path, tmp_path: Path):
    serve = subprocess.Popen(
        [
            str(venv / "kvevents"),
            "serve",
            "--endpoint",
            "tcp://127.0.0.1:0",
            "--replay-endpoint",
            "tcp://127.0.0.1:0",
            "--rate",
            "50",
            "--duration",
            "20",
            "--heartbeat",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=_env(),
    )
    try:
        assert serve.stdout is not None
        first = serve.stdout.readline().split()
        assert first[:2] == ["kvevents", "serve:"], (first, serve.stderr.read() if serve.stderr else "")
        live, replay = first[first.index("live") + 1], first[first.index("replay") + 1]
        r = _kv(venv, "tail", live, "--replay", replay, "--count", "5", "--duration", "15", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        seqs = [ln for ln in r.stdout.splitlines() if ln.startswith("seq=")]
        assert len(seqs) == 5 and seqs[0].startswith("seq=0 replay"), r.stdout
    finally:
        serve.terminate()
        serve.communicate(timeout=30)
