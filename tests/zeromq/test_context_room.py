"""The shared ZeroMQ context has room for a fleet: more than libzmq's default 1,023 sockets."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
import zmq

from kvevents.zeromq.context import FLEET_SOCKETS, make_room

_OPEN_MANY = """
import resource, zmq
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
import kvevents.zeromq.subscriber  # importing the transport raises the shared context's limit
ctx = zmq.Context.instance()
socks = [ctx.socket(zmq.SUB) for _ in range(1500)]  # 250 sources' worth of a subscriber's sockets
for s in socks:
    s.close(0)
print(ctx.get(zmq.MAX_SOCKETS))
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096, reason="needs `ulimit -Hn` >= 4096")
def test_the_shared_context_holds_more_sockets_than_libzmqs_default():
    run = subprocess.run([sys.executable, "-c", _OPEN_MANY], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-600:]
    assert int(run.stdout) >= 1500


def test_make_room_raises_a_fresh_context_and_leaves_a_started_one():
    fresh = zmq.Context()
    try:
        assert make_room(fresh) == min(FLEET_SOCKETS, fresh.get(zmq.SOCKET_LIMIT)) > 1023
    finally:
        fresh.term()
    started = zmq.Context()
    sock = started.socket(zmq.PAIR)
    try:
        assert make_room(started) >= 1023  # set, but libzmq sized its slots at the first socket
    finally:
        sock.close(0)
        started.term()
