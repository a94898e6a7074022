"""The `conformance hash` adapter process: JSON lines in and out, with bounds the adapter cannot break.

- An answer line is read at most `max_line` bytes at a time: a longer one (an adapter that never
  writes a newline) ends the reading, reported as "too_long", instead of growing the kit's memory.
- Lines stay bytes until `receive` decodes them, so invalid UTF-8 is one bad answer ("bad_utf8"),
  never a dead reader thread; stderr is decoded with replacement.
- At most LINE_QUEUE answer lines wait in memory; past that the adapter blocks on its pipe.
- The adapter runs in a session (process group) of its own, and `close` kills the whole group,
  so a child the adapter started does not outlive the kit.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from typing import IO, Any

__all__ = ["Adapter", "MAX_LINE"]

MAX_LINE = 1 << 20  # bytes per answer line (the longest right answer is a few KB)
LINE_QUEUE = 64  # answer lines read ahead of the kit
ERR_PIECE = 4096  # stderr is kept in pieces of at most this many bytes
EXIT_GRACE_S = 1.0  # after stdin closes, the adapter has this long to exit before its group is killed

_EOF = object()
_TOO_LONG = object()


class Adapter:
    """One adapter process; `send` a request, `receive` the answer to a case id (with a timeout)."""

    def __init__(self, command: str, cwd: str | None = None, *, max_line: int = MAX_LINE) -> None:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ValueError(f"--cmd {command!r}: {exc}") from None
        if not argv:
            raise ValueError("--cmd is empty")
        if max_line < 2:
            raise ValueError(f"max_line must be >= 2, got {max_line}")
        self.max_line = max_line
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                start_new_session=True,  # its own process group: close() kills its children too
            )
        except OSError as exc:
            raise ValueError(f"--cmd {command!r} cannot be started: {exc}") from None
        self.lines: queue.Queue[object] = queue.Queue(LINE_QUEUE)
        self.stderr_tail: list[str] = []
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    # ------------------------------------------------------------ reading
    def _put(self, item: object) -> bool:
        while not self._closed.is_set():
            try:
                self.lines.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _read(self) -> None:
        out: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        try:
            while True:
                line = out.readline(self.max_line + 1)
                if not line:
                    break
                if len(line) > self.max_line:
                    self._put(_TOO_LONG)  # stop reading: the rest of that line is never kept
                    return
                if not self._put(line):
                    return
        except (OSError, ValueError):  # the pipe closed under us by close()
            pass
        self._put(_EOF)

    def _read_err(self) -> None:
        err: IO[bytes] = self.proc.stderr  # type: ignore[assignment]
        try:
            while piece := err.readline(ERR_PIECE):
                text = piece.decode("utf-8", "replace").rstrip()
                self.stderr_tail = (self.stderr_tail + [text])[-5:]
        except (OSError, ValueError):
            pass

    def stderr_done(self, timeout: float) -> None:
        """Wait until the exited adapter's stderr is read to its end (its last lines name the crash)."""
        self._err_reader.join(timeout)

    # ------------------------------------------------------------ requests and answers
    def send(self, obj: dict[str, Any]) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def receive(self, case_id: str, timeout: float) -> tuple[str, Any]:
        """("ok", answer) / ("timeout", None) / ("exited", code) / ("garbled", line) /
        ("too_long", max_line) / ("bad_utf8", byte offset in the line)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", None
            try:
                item = self.lines.get(timeout=left)
            except queue.Empty:
                return "timeout", None
            if item is _EOF:
                try:
                    return "exited", self.proc.wait(EXIT_GRACE_S)
                except subprocess.TimeoutExpired:
                    return "exited", None
            if item is _TOO_LONG:
                return "too_long", self.max_line
            assert isinstance(item, bytes)
            try:
                line = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                return "bad_utf8", exc.start
            try:
                answer = json.loads(line)
            except ValueError:
                return "garbled", line.strip()[:120]
            if not isinstance(answer, dict):
                return "garbled", line.strip()[:120]
            if answer.get("id") == case_id:
                return "ok", answer
            # an answer to an earlier, timed-out case: skip it

    # ------------------------------------------------------------ the end
    def close(self) -> None:
        """Close stdin, give the adapter EXIT_GRACE_S to exit, then kill its whole process group."""
        self._closed.set()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        self._wait_unreaped(EXIT_GRACE_S)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the leader is not reaped yet: its pid is not reused
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent
            pass
        for thread, stream in ((self._reader, self.proc.stdout), (self._err_reader, self.proc.stderr)):
            thread.join(EXIT_GRACE_S)  # at EOF now that the group is gone (unless a process escaped it)
            if not thread.is_alive() and stream is not None:
                stream.close()

    def _wait_unreaped(self, timeout: float) -> None:
        """Wait until the leader has exited, without reaping it (so its pid, the group id, stays taken)."""
        deadline = time.monotonic() + timeout
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, self.proc.pid, flags) is not None:
                    return
            except ChildProcessError:  # already reaped (by a wait() in receive)
                return
            time.sleep(0.01)
