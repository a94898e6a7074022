"""The ZeroMQ transport: fan-out with replay and snapshots, and per-source sequencing and repair.

| file | what it owns |
|---|---|
| `publisher.py` | `Publisher`: seqs, the replay ring, the publish path, the never-blocking send queue |
| `publisher_sockets.py` | the publisher's context, PUB and ROUTER sockets: bind/connect, CURVE, bind errors as one ValueError, the plain-bind warning, close |
| `publisher_service.py` | the publisher's service thread: idle heartbeats, the ROUTER polled and served in slices |
| `publisher_config.py` | `PublisherConfig`: the settings, named as vLLM's / SGLang's `KVEventsConfig` |
| `replay_server.py` | the publisher's ROUTER: replay, KVE/SNAPSHOT, KVE/DESCRIBE, in slices |
| `view.py` | the publisher's compact view of live block copies; snapshot batches rebuilt from it |
| `subscriber.py` | `Subscriber`: the socket loop around the sequencer, many publishers |
| `sequencer.py` | sans-IO per-(source, dp_rank) sequencing and repair, with an injectable clock |
| `streams.py` | the sequencer's per-stream state and repair requests |
| `repair_queue.py` | the sequencer's requests on each DEALER: one in flight, deadlines, retries, budget |
| `source.py` | `Source`: one publisher to follow (endpoints, CURVE keys) and its `NAME=EP[,REPLAY]` form |
| `engine_requests.py` | one-shot replay / DESCRIBE / SNAPSHOT requests to a replay ROUTER |
| `wire.py` | wire constants and the endpoint rules (bind or connect, per-rank ports) |
| `security.py` | opt-in CURVE: key files, socket options, ZAP allow-lists |
| `metrics.py` | Prometheus metrics of publishers and subscribers, read at scrape time |
| `context.py` | room on the shared ZeroMQ context for a fleet's sockets (raised when this package is imported) |

Contract: schemas/README.md, "Wire format" and "Transport in one page". Imports the contract and
`kvevents.feed` only.
"""

from kvevents.zeromq.context import make_room as _make_room

_make_room()  # before any socket of the shared context exists (see context.py)
