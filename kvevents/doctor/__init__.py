"""`kvevents doctor`: diagnose a stream check by check, each failure with a hint.

| file | what it owns |
|---|---|
| `zeromq.py` | a live ZeroMQ publisher: address, live frames, replay, DESCRIBE, snapshot, hashes |
| `nats.py` | a kvevents JetStream stream: server, stream, subjects, snapshots |
"""
