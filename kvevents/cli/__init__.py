"""`kvevents` command line: one module per command, each a thin layer (parse flags, call the library,
render). This module registers them on the app, in the order `kvevents --help` lists them.

| file | what it owns |
|---|---|
| `app.py` | the typer app, `--version`, the one place errors become exit codes (0, 1 check failed, 2 user error) |
| `options.py` | flags several commands share: endpoints, HOST:PORT, a log file to write, CURVE keys, NATS options |
| `config.py` | `--config FILE.toml` / `--print-config` of route, bridge, relay and serve |
| `output.py` | consoles, one-line stdout/stderr messages and warnings, library logs on stderr, the check table |
| `route.py` | `route`: the HTTP router service over publishers or a JetStream stream |
| `demo.py` | `demo`: the whole system on loopback (kvevents.demo), as tables, JSON or HTML |
| `hash.py` | `hash`: a token sequence's hashes by the contract or by vLLM 0.33's chain |
| `schema.py` | `schema`: the JSON Schema of a batch payload |
| `golden.py` | `golden`: this installation against the golden vectors |
| `version.py` | `version`: the version and the hashing path |
| `doctor.py` | `doctor`: the checklist of a publisher or a JetStream stream (kvevents.doctor) |
| `record.py` | `record`: live streams into a record log (kvevents.recordlog.live) |
| `replay.py` | `replay`: a record log republished (kvevents.recordlog.republish) |
| `fetch.py` | `fetch`: a replay buffer or a stored stream into a log or an index |
| `bridge.py` | `bridge`: ZeroMQ streams into NATS JetStream (kvevents.jetstream.bridge) |
| `relay.py` | `relay`: an engine's stream republished through kvevents' publisher (kvevents.relay) |
| `serve.py` | `serve`: simulated workers publishing (kvevents.sim.serve) |
| `tail.py` | `tail`: every batch of a publisher, with notices |
| `keys.py` | `keys generate`: a CURVE keypair |
| `conformance.py` | `conformance hash / stream / drive / render`: the contract tests against an engine (kvevents.conformance) |
| `log.py` | `log inspect / repair / export / index`: tools over a record log (kvevents.recordlog) |
"""

from kvevents.cli import (
    bridge,
    conformance,
    demo,
    doctor,
    fetch,
    golden,
    keys,
    log,
    record,
    relay,
    replay,
    route,
    schema,
    serve,
    tail,
    version,
)
from kvevents.cli import hash as hash_  # not to shadow the builtin here
from kvevents.cli.app import CheckFailed, UserError, app, main, user_error

app.command("route")(route.route_cmd)
app.command("demo")(demo.demo_cmd)
app.command("hash", context_settings=hash_.CONTEXT_SETTINGS)(hash_.hash_cmd)
app.command("schema")(schema.schema)
app.command("golden")(golden.golden)
app.command("version")(version.version)
app.command("doctor")(doctor.doctor_cmd)
app.command("record")(record.record_cmd)
app.command("replay")(replay.replay_cmd)
app.command("fetch")(fetch.fetch_cmd)
app.command("bridge")(bridge.bridge_cmd)
app.command("relay")(relay.relay)
app.command("serve")(serve.serve)
app.command("tail")(tail.tail)
app.add_typer(keys.keys_app, name="keys")
app.add_typer(conformance.conformance_app, name="conformance")
app.add_typer(log.log_app, name="log")

__all__ = ["app", "main", "UserError", "CheckFailed", "user_error"]
