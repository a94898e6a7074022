"""The consumer service behind `kvevents route`: an event feed into a BlockIndex, answered over HTTP.

| file | what it owns |
|---|---|
| `core.py` | `RouterService`: applies a feed's deliveries to the index, scores requests, one lock |
| `score_request.py`, `score_body.py` | the POST /score body: its pydantic contract, its fast decoders |
| `scoring.py` | the /score answer: matches, predictions, loads, ranking by cost, the routing decision's credit |
| `freshness.py` | which publishers are stale, read in O(1) per answer |
| `http_api.py` | the FastAPI app on uvicorn: /score, /workers, /metrics, /status.json, the status page |
| `status.py` | what `GET /` and `GET /status.json` show |
| `metrics.py`, `load_metrics.py` | Prometheus metrics of the service (and of its loads and predictions), read at scrape time |
| `static/` | the status page |
"""
