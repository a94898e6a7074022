"""The consumer service behind `kvevents route`: an event feed into a BlockIndex, answered over HTTP.

| file | what it owns |
|---|---|
| `core.py` | `RouterService`: applies a feed's deliveries to the index, scores requests, one lock |
| `worker_rows.py` | one row of GET /workers (a source's dp rank) laid out as JSON, defined once |
| `score_request.py`, `score_body.py` | the POST /score body: its pydantic contract, its fast decoders |
| `scoring.py` | the /score answer: matches, predictions, loads, ranking by cost, the routing decision's credit |
| `answer_rows.py` | the /score answer's worker objects built from the ranking's columns (compiled, with a Python twin) |
| `freshness.py` | which publishers are stale, read in O(1) per answer |
| `http_api.py` | the FastAPI app on uvicorn: /score, /workers, /metrics, /status.json, the status page |
| `auth.py` | bearer keys (full, read-only) checked in constant time, TLS files, what a read-only caller does not see |
| `proxy.py` | `Proxy`: OpenAI's /v1/completions, /v1/chat/completions, /v1/models sent to the best-ranked worker |
| `proxy_request.py` | what the proxy reads from an OpenAI request to rank workers; base models vs adapters |
| `proxy_targets.py` | `--worker-url NAME[#dpR]=URL`: a worker's URL, and the URLs that failed to connect lately |
| `proxy_stats.py` | the proxy's in-flight blocks per worker (the router's own load), its rates, errors, TTFB |
| `status.py` | what `GET /` and `GET /status.json` show |
| `metrics.py`, `load_metrics.py` | Prometheus metrics of the service (and of its loads and predictions), read at scrape time |
| `static/` | the status page |
"""
