"""The contract tests as a product: check any engine's hashes, stream, replay and invariants.

`hashkit` checks a hash function through a JSON-lines adapter; `stream` observes a live
publisher and `rules` judges what it saw; `drive` sends prompts to an OpenAI-compatible server
and checks the events they cause; `report` renders the verdicts. The CLI is `kvevents conformance`.


| file | what it owns |
|---|---|
| `adapter.py` | The `conformance hash` adapter process: JSON lines in and out, with bounds the adapter cannot break. |
| `drive.py` | `conformance drive`: the seed's invariant end to end, through an OpenAI-compatible server. |
| `hashkit.py` | `conformance hash`: check any implementation of the event chain through a JSON-lines adapter. |
| `hashkit_vllm.py` | `conformance hash --profile vllm-*`: cases for an implementation of vLLM 0.33's block-hash chain. |
| `probes.py` | The ROUTER extensions judged: KVE/DESCRIBE and KVE/SNAPSHOT (not offered when unanswered). |
| `profiles.py` | Hash profiles: how a published BlockStored's hashes are recomputed from its token_ids. |
| `pytest_plugin.py` | pytest plugin (entry point `pytest11`): `pytest --kvevents-endpoint ...` runs the conformance rules as ... |
| `render.py` | `kvevents conformance render`: does the router tokenize prompts exactly as the engine does? |
| `report.py` | Verdicts per named rule and their rendering (table or JSON); exit code 0 only if all applicable pass. |
| `rules.py` | The stream rules as a pure state machine: feed it live messages and replies, get verdicts. |
| `shape.py` | Strict checks of single messages: live frames, the batch array, replay and snapshot replies. |
| `storage.py` | `kvevents conformance storage`: the end-to-end storage-tier test of SGLang's namespace change, run against ... |
| `storage_engine.py` | SGLang's own HiRadixCache and HiCacheController on one rank, driven the way its scheduler drives them, for ... |
| `stream.py` | `conformance stream`: observe a live publisher with raw sockets and feed the rules. |
| `tally.py` | One rule's running tally while a stream is judged: checks, failures, unknowns, a few examples. |
"""

from kvevents.conformance.report import Report, RuleResult, Status

__all__ = ["Report", "RuleResult", "Status"]
