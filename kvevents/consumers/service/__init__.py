"""The consumer service behind `kvevents route`: an event feed into a BlockIndex, answered over HTTP.

| file | what it owns |
|---|---|
| `core.py` | `RouterService`: applies a feed's deliveries to the index, scores requests, one lock |
| `http_api.py` | the FastAPI app on uvicorn: /score, /workers, /metrics, /status.json, the status page |
| `status.py` | what `GET /` and `GET /status.json` show |
| `metrics.py` | Prometheus metrics of the service, read at scrape time |
| `static/` | the status page |
"""
