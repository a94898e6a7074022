"""NATS JetStream for fleets: engines' ZeroMQ streams bridged into one stream, read back as a feed.

| file | what it owns |
|---|---|
| `link.py` | what bridge and feed share: subjects, headers, connection options, the stream |
| `bridge.py` | the bridge: Subscriber deliveries (gap-repaired) into JetStream, snapshots stored in the stream |
| `feed.py` | `JetStreamFeed`: a consumer's `EventFeed` over a kvevents JetStream stream |
| `consuming.py` | the feed's readers into its backlog: what is stored by pull, then the tail by push; or a durable pull consumer |
| `messages.py` | the feed's queue items, and a stored message's subject and headers parsed with a guard |
| `backlog.py` | the feed's queue from its NATS side to `poll()`, bounded: past it the server is held back |
| `pacing.py` | the cold start's picked snapshots handed to the ordering a few per `poll()`, not all decoded at once |
| `replays.py` | the bridge's replayed batches told apart: first-contact history or a gap's repair |
| `signing.py` | message authenticity: the HMAC-SHA256 key file bridges and consumers share (`--sign-key`) |
| `gate.py` | what a consumer lets through: signature, headers, snapshots matching their end marker |
| `stored.py` | a live batch, a snapshot and its assembly from parts, a repair's re-read request |
| `positions.py` | where a feed starts: a record log's positions per (source, dp_rank), `resume=` of the feed |
| `order.py` | what JetStream holds back, put into per-(source, dp_rank) engine order, distrustfully |
| `integrity.py` | per-seq payload and state digests: conflicts and anti-entropy against stored snapshots |
| `reread.py` | reading one subject filter start to end (cold-start snapshots, a repair's re-read), the stream's info |
| `admin.py` | looking at a stream from outside (`kvevents doctor --nats`) |

Imports the contract, `kvevents.feed`, and `kvevents.zeromq` (the bridge's Subscriber).
"""
