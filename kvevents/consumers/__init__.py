"""Reference consumers of KV-cache events: a reference-counted block index and a prefix router.

`kvevents.consumers.service.core` adds the subscription glue and the HTTP service behind `kvevents route`;
`cost` ranks /score answers by cost, from `loads` (scraped by `scraper` via `engine_load` and
`prom_text`, or pushed) and `predictions` (routed requests' pages, kept apart from the index).
Consumers use only kvevents' public API (kvevents, hashing, events, subscriber, errors).


| file | what it owns |
|---|---|
| `copies.py` | One worker's block copies in HashTable views: add, drop and clear them, and count them. |
| `cost.py` | The routing cost and the ranking of /score: which workers an answer lists, in which order. |
| `engine_load.py` | An engine's /metrics page -> its load per data-parallel rank: requests running and waiting, the share of ... |
| `holders.py` | Who holds one table entry: a slot's `rows` word and the record pool behind it (pure-Python twin). |
| `index_bounds.py` | What one publisher may cost a BlockIndex: dp ranks per source, and adapter names that free themselves. |
| `index_lookups.py` | The router's seam into a BlockIndex: `holds` and `prefix_match`, and the plans and layouts they walk. |
| `index_reports.py` | Read-only reports over a BlockIndex: who holds a hash, copies per source, medium and adapter. |
| `indexer.py` | BlockIndex: which worker holds which published block, reference-counted and memory-lean. |
| `key_modes.py` | How a source is keyed: the key modes, their `--key-mode` parsing, and `auto`'s detection. |
| `keying.py` | Token-derived keys: index any engine's stream (vLLM, SGLang, ...) by the contract's event hashes. |
| `keys.py` | Token-derived keys of pages: the contract's event hashes, with an engine's extra keys mixed in. |
| `loads.py` | Workers' load for the cost model: the newest of three sources per worker, as vectors by worker index. |
| `lookup.py` | The index walk: per-worker consecutive prefix lengths of a request, by medium. |
| `paged.py` | zeros_paged: np.zeros for the index's big arrays, on 2 MiB boundaries with transparent huge pages. |
| `predictions.py` | Predicted block copies: a routed request's whole pages, credited to the worker it was sent to until that ... |
| `prom_text.py` | Read the samples of a few metric families out of Prometheus' text exposition format (0.0.4, and the ... |
| `prompts.py` | Text and chat prompts to token ids, rendered as vLLM and SGLang render them. |
| `router.py` | PrefixRouter: rank workers by the longest cached prefix of a request, weighted by medium. |
| `scraper.py` | The router's load scraper: each engine's Prometheus page (`route --metrics-url NAME=URL`), read every ... |
| `service/` | a package of its own (its __init__ has its map) |
| `table.py` | HashTable: int64 block hash -> one row of flat numpy arrays (the BlockIndex's store). |
| `worker_key.py` | What a worker is to a consumer: a typed (source, dp_rank) key, the same in the index, the router, the ... |
"""

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.router import DEFAULT_MEDIUM_WEIGHTS, PrefixRouter, WorkerScore
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["BlockIndex", "PrefixRouter", "WorkerKey", "WorkerScore", "DEFAULT_MEDIUM_WEIGHTS"]
