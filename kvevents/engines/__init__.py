"""Other engines' hashing and event fields, read as they are (kvevents' own contract is kvevents.hashing).

`kvevents.engines.vllm`: vLLM 0.33's block-hash chain (sha256 / sha256_cbor), its extra keys, the
uint64 form it publishes, and a decoder that keeps the fields kvevents' contract structs drop
(`extra_keys`, `group_idx`, raw bytes hashes). `kvevents.engines.metrics`: vLLM's and SGLang's
Prometheus names for a worker's load (read by the router's scraper, written by the simulated workers).


| file | what it owns |
|---|---|
| `metrics.py` | The engines' own Prometheus metric names and labels that carry a worker's load (facts, read as vLLM 0.33 ... |
| `vllm.py` | vLLM 0.33's prefix-cache block hashes: the chain, its seed, its extra keys, the published uint64. |
| `vllm_wire.py` | vLLM 0.33's KV event wire, read with every field (kvevents' contract structs keep only their own). |
"""
