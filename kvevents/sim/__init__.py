"""Simulated engines: workloads and workers that publish KV events as SGLang and vLLM do.

| file | what it owns |
|---|---|
| `worker.py` | multi-tenant `Workload`s and the contract `SimWorker` (a RadixCache and a page store) |
| `vllm.py` | a vLLM 0.33-faithful worker: its block pool behaviour, hashes and events |
| `serve.py` | `kvevents serve`: a fleet of workers with one publisher each (DP ranks) and the loop serving them |
| `http.py` | a minimal OpenAI-compatible `/v1/completions` in front of a worker (`serve --http`) |
| `timing.py` | load-honest serving: time per prefilled and decoded token, a queue past `max_running` |
| `metrics.py` | a simulated worker's /metrics page in its engine's metric names |
"""
