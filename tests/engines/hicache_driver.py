"""SGLang 0.5.20's HiCache storage tier over kvevents' backend, in one process inside the SGLang venv.

Run by tests/engines/test_sglang_hicache.py as `python hicache_driver.py TMPDIR`; prints one
KVEVENTS-REPORT line (harness.Report). Real: SGLang's HiRadixCache, HiCacheController, host pool,
its storage threads and its `dynamic` backend factory building kvevents.plugins.hicache; kvevents'
BlockIndex and PrefixRouter fed by the cache's own events; `kvevents conformance storage` through
its entry point in this process, and as a subprocess without the CPU stand-ins. Stand-ins (standins.py): TORCHVISION, and HICACHE's three CUDA-only spots of the host tier.
"""

from __future__ import annotations

import standins

STANDINS = [standins.stub_torchvision(), *standins.stand_in_hicache_cpu()]  # before any SGLang import

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import hicache_damage  # noqa: E402
from harness import Report  # noqa: E402

from kvevents.conformance.storage import RULES, StorageOptions, run_storage  # noqa: E402
from kvevents.plugins import STORAGE_BACKENDS  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OURS = STORAGE_BACKENDS["sglang"]
SEED_PREFIX = "seed_"  # one check per conformance rule of the seed scenario over kvevents' backend


def rule_check(rule: str) -> str:
    return SEED_PREFIX + rule.replace("-", "_")


def seed_scenario(report: Report, tmp: str) -> None:
    """The seed's end-to-end test: kvevents' backend, SGLang's generic page interface."""
    opts = StorageOptions(OURS.module, OURS.class_name, {"path": f"{tmp}/seed-pages", "fsync": False}, seed=20)
    rep = run_storage(opts)
    for r in rep.results:
        report.check(rule_check(r.rule), r.status.value == "pass", f"{r.status.value}: {r.detail} {r.examples}")
    report.figures["seed_backend_stats"] = rep.figures.get("backend")  # type: ignore[assignment]
    report.figures["seed_s"] = rep.figures["seconds"]
    report.figures["seed_credit_while_resident"] = rep.figures["credit_while_resident"]  # type: ignore[assignment]


def passes(report: Report, name: str, opts: StorageOptions) -> None:
    rep = run_storage(opts)
    report.check(name, rep.ok and rep.results[0].status.value == "pass", f"failed {rep.failed()}")


CLI_ARGS = ["conformance", "storage", "--seed", "3", "--json"]


def cli_args(module: str, cls: str, config: dict[str, Any]) -> list[str]:
    return [*CLI_ARGS, "--module", module, "--class", cls, "--config", json.dumps(config)]


def cli(tmp: str, standins_: str, module: str, cls: str, config: dict[str, Any]) -> subprocess.Popen[str]:
    """`python -m kvevents conformance storage ... --json` in this venv (the stand-ins come from
    hicache_site/sitecustomize.py, never from kvevents)."""
    env = dict(os.environ, KVEVENTS_TEST_STANDINS=standins_)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "hicache_site"), str(HERE), str(REPO)])
    cmd = [sys.executable, "-m", "kvevents", *cli_args(module, cls, config)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)


def cli_in_process(tmp: str, module: str, cls: str, config: dict[str, Any]) -> tuple[int, str, str]:
    """The same command through kvevents' real entry point in this process, which already has the
    HiCache stand-ins sitecustomize.py would install (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from kvevents.cli import main as kvevents_main

    here = os.getcwd()
    os.chdir(tmp)
    try:
        with CliRunner().isolation() as (out, err, _mixed):
            try:
                code: Any = kvevents_main(cli_args(module, cls, config))
            except SystemExit as exc:
                code = exc.code
            sys.stdout.flush()
            sys.stderr.flush()
            return int(code or 0), out.getvalue().decode(), err.getvalue().decode()
    finally:
        os.chdir(here)


def cli_checks(report: Report, tmp: str, cuda: subprocess.Popen[str]) -> None:
    """`kvevents conformance storage` passes ours and fails a namespace-blind backend (in process,
    with the CPU stand-ins); without them (`cuda`, a subprocess started at the driver's start: its
    interpreter must not have them) it exits 2 with one line."""
    runs = {
        "good": cli_in_process(tmp, OURS.module, OURS.class_name, {"path": f"{tmp}/cli-pages", "fsync": False}),
        "bad": cli_in_process(tmp, "broken_hicache", "ClaimsEverything", {}),
    }
    out, err = cuda.communicate(timeout=300)
    runs["cuda"] = (cuda.returncode, out, err)
    rc, out, err = runs["good"]
    ok = rc == 0 and json.loads(out)["ok"]
    report.check("cli_passes_kvevents_backend", ok, f"rc {rc} {err.strip()[-500:]}")
    rc, out, err = runs["bad"]
    failed = set(json.loads(out)["failed"]) if rc == 1 else set()
    want = {"first-request-computes", "other-namespaces-miss", "contents-round-trip"}
    report.check("cli_fails_a_namespace_blind_backend", want <= failed, f"rc {rc} failed {sorted(failed)}")
    rc, out, err = runs["cuda"]
    lines = [ln for ln in err.splitlines() if ln.startswith("kvevents:")]
    report.check(
        "cli_without_cpu_standins_exits_2_one_line",
        rc == 2 and len(lines) == 1 and "cannot be built here" in lines[0] and not out,
        f"rc {rc} {lines}",
    )


def main(tmp: str) -> None:
    report = Report("sglang-hicache")
    report.standins = list(STANDINS)
    cuda = cli(tmp, "torchvision", OURS.module, OURS.class_name, {"path": f"{tmp}/cli-cuda"})  # overlaps the rest
    t = time.monotonic()
    with report.guard("seed_run"):
        seed_scenario(report, tmp)
    with report.guard("interface_v1_run"):
        config = {"path": f"{tmp}/v1-pages", "fsync": False, "interface_v1": 1}
        passes(report, "interface_v1_conformance", StorageOptions(OURS.module, OURS.class_name, config, seed=21))
    with report.guard("sglang_file_backend_run"):  # SGLang's own file backend, for comparison
        os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = f"{tmp}/sglang-file"
        opts = StorageOptions("sglang.srt.mem_cache.hicache_storage", "HiCacheFile", {}, seed=22)
        passes(report, "sglang_hicache_file_conformance", opts)
    with report.guard("forgets_writes_run"):
        rep = run_storage(StorageOptions("broken_hicache", "ForgetsWrites", {}, seed=23))
        want = {"pages-under-storage-keys", "second-request-hits-storage"}
        report.check("conformance_fails_a_backend_that_forgets", want <= set(rep.failed()), f"failed {rep.failed()}")
    with report.guard("damage_run"):
        hicache_damage.run(report, tmp)
    report.figures["in_process_s"] = round(time.monotonic() - t, 2)
    t = time.monotonic()
    with report.guard("cli_run"):
        cli_checks(report, tmp, cuda)
    if cuda.poll() is None:  # cli_checks failed before reading it
        cuda.kill()
        cuda.communicate()
    report.figures["cli_s"] = round(time.monotonic() - t, 2)
    report.figures["rules"] = len(RULES)
    report.emit()


if __name__ == "__main__":
    main(sys.argv[1])
