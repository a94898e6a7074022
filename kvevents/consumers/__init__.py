"""Reference consumers of KV-cache events: a reference-counted block index and a prefix router.

`kvevents.consumers.service.core` adds the subscription glue and the HTTP service behind `kvevents route`;
`cost` ranks /score answers by cost, from `loads` (scraped by `scraper` via `engine_load` and
`prom_text`, or pushed) and `predictions` (routed requests' pages, kept apart from the index).
Consumers use only kvevents' public API (kvevents, hashing, events, subscriber, errors).
"""

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.router import DEFAULT_MEDIUM_WEIGHTS, PrefixRouter, WorkerScore
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["BlockIndex", "PrefixRouter", "WorkerKey", "WorkerScore", "DEFAULT_MEDIUM_WEIGHTS"]
