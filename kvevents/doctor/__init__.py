"""`kvevents doctor`: diagnose a stream check by check, each failure with a hint.

| file | what it owns |
|---|---|
| `zeromq.py` | a live ZeroMQ publisher: address, live frames, replay, DESCRIBE, snapshot (the checklist) |
| `hashes.py` | "published hashes recompute" under a profile (contract, vLLM), detected from the stream when not given |
| `wiring.py` | "sockets and keys": a PUB at the live endpoint, a ROUTER at the replay one, CURVE keys that fit |
| `nats.py` | a kvevents JetStream stream: server, stream, subjects, snapshots |
"""
