"""Pieces shared by the tests (no tests here); fixtures live in tests/conftest.py.

| module | what it owns |
|---|---|
| `repo.py` | paths into the checkout: the repository root, README, golden file |
| `cli.py` | running `kvevents`: in-process (typer's CliRunner) or as a subprocess, one-line error checks |
| `wait.py` | `wait_until`: poll a condition against a monotonic deadline |
| `clock.py` | `FakeClock`: the injectable clock of sans-IO state machines |
| `payloads.py` | batch payload builders (the default wire, as engines publish it) |
| `marks.py` | the markers a helper needs (`subprocess`, `nats`), checked against the running test |
| `conformance_fakes.py` | deliberately broken publishers for the conformance tests |
| `jetstream.py` | a simulated engine and router over JetStream, `caught_up`, stored seqs |
| `live_publisher.py` | a real Publisher fed on a thread (contract cache events or vLLM payloads) |
| `route_live.py` | a live `kvevents route` fed by a `kvevents serve` subprocess |
| `recordlog.py` | event streams and small record logs |
| `strict_decoders.py` | strict external decoders (vLLM's and SGLang's field lists) |
| `ahead.py` | slow module set-ups (engine drivers, the wheel's venv) run ahead of their tests under xdist |
"""
