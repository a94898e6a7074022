"""`kvevents` command line: one module per command, each a thin layer (parse flags, call the library,
render). This module registers them on the app, under the headings and in the order that
`kvevents --help` lists them.

| file | what it owns |
|---|---|
| `app.py` | the typer app, `--version`, the help's headings, the one place errors become exit codes (0, 1 check failed, 2 user error) |
| `helpfmt.py` | how `--help` reads: placeholders (FILE, TOKENS...), the type column, docstrings as paragraphs, option panels |
| `options.py` | flags several commands share: endpoints, HOST:PORT, a log file to write, CURVE keys, NATS options (NatsFlags with the trust flags, CurveClients, CurveServerFlags) |
| `flag_groups.py` | typed bundles of flags: a frozen dataclass of `flag(...)` fields put into a command in place of one parameter (`@flag_group`) |
| `config.py` | `--config FILE.toml` / `--print-config` of route, bridge, relay and serve |
| `output.py` | consoles, one-line stdout/stderr messages and warnings, library logs on stderr, the check table |
| `stopping.py` | SIGINT / SIGTERM for the long-running commands: one stop event, and whether Ctrl-C was it |
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
| `serve_options.py` | `serve`'s flag bundles: workload, endpoints and wire, engine emulated, the per-worker HTTP front |
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
    helpfmt,
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
from kvevents.cli.app import (
    CONSUMER_SIDE,
    CONTRACT,
    ENGINE_SIDE,
    LOGS,
    MAIN_JOB,
    CheckFailed,
    UserError,
    app,
    main,
    user_error,
)

app.command("demo", rich_help_panel=MAIN_JOB)(demo.demo_cmd)
app.command("route", rich_help_panel=MAIN_JOB)(route.route_cmd)
app.command("serve", rich_help_panel=ENGINE_SIDE)(serve.serve)
app.command("relay", rich_help_panel=ENGINE_SIDE)(relay.relay)
app.command("bridge", rich_help_panel=ENGINE_SIDE)(bridge.bridge_cmd)
app.add_typer(keys.keys_app, name="keys", rich_help_panel=ENGINE_SIDE)
app.command("tail", rich_help_panel=CONSUMER_SIDE)(tail.tail)
app.command("doctor", rich_help_panel=CONSUMER_SIDE)(doctor.doctor_cmd)
app.command("record", rich_help_panel=LOGS)(record.record_cmd)
app.command("fetch", rich_help_panel=LOGS)(fetch.fetch_cmd)
app.command("replay", rich_help_panel=LOGS)(replay.replay_cmd)
app.add_typer(log.log_app, name="log", rich_help_panel=LOGS)
app.command("hash", context_settings=hash_.CONTEXT_SETTINGS, rich_help_panel=CONTRACT)(hash_.hash_cmd)
app.command("golden", rich_help_panel=CONTRACT)(golden.golden)
app.command("schema", rich_help_panel=CONTRACT)(schema.schema)
app.add_typer(conformance.conformance_app, name="conformance", rich_help_panel=CONTRACT)
app.command("version", rich_help_panel=CONTRACT)(version.version)
helpfmt.reflow_help(app)  # docstrings as paragraphs: no line break mid-sentence in --help

__all__ = ["app", "main", "UserError", "CheckFailed", "user_error"]
