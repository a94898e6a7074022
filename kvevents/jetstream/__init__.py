"""NATS JetStream for fleets: engines' ZeroMQ streams bridged into one stream, read back as a feed.

| file | what it owns |
|---|---|
| `link.py` | what bridge and feed share: subjects, headers, connection options, the stream |
| `bridge.py` | the bridge: Subscriber deliveries (gap-repaired) into JetStream, snapshots stored in the stream |
| `feed.py` | `JetStreamFeed`: a consumer's `EventFeed` over a kvevents JetStream stream |
| `messages.py` | the feed's queue items, and a stored message's subject and headers parsed with a guard |
| `replays.py` | the bridge's replayed batches told apart: first-contact history or a gap's repair |
| `order.py` | what JetStream holds back, put into per-(source, dp_rank) engine order |
| `admin.py` | looking at a stream from outside (`kvevents doctor --nats`) |

Imports the contract, `kvevents.feed`, and `kvevents.zeromq` (the bridge's Subscriber).
"""
