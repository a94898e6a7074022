"""`kvevents doctor ENDPOINT`: the checklist to run when events do not arrive (checks in kvevents.doctor.zeromq)."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from kvevents.cli.app import CheckFailed, app, user_error
from kvevents.cli.keys import CLIENT_CERT_HELP, SERVER_KEY_HELP, curve_client
from kvevents.cli.logtools_common import print_checks
from kvevents.cli.nats_trust import INSECURE_HELP, SIGN_KEY_HELP


@app.command("doctor")
def doctor_cmd(
    endpoint: Optional[str] = typer.Argument(None, help="The publisher's live endpoint, e.g. tcp://127.0.0.1:5557."),
    nats_url: Optional[str] = typer.Option(
        None, "--nats", help="Check a NATS JetStream stream (URL) instead of an endpoint."
    ),
    stream: str = typer.Option("kvevents", "--stream", help="With --nats: the JetStream stream name."),
    replay: Optional[str] = typer.Option(None, "--replay", help="Its replay endpoint (replay, snapshot, describe)."),
    page_size: Optional[int] = typer.Option(
        None, "--page-size", "-p", help="Page size, to recompute published hashes."
    ),
    topic: Optional[str] = typer.Option(None, "--topic", help="The topic your consumer subscribes to."),
    timeout: float = typer.Option(3.0, "--timeout", help="Seconds to listen (and to wait for each answer)."),
    salt: list[str] = typer.Option([], "--salt", help="A tenant cache_salt chain heads may be seeded with."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    curve_server_key: Optional[str] = typer.Option(None, "--curve-server-key", help=SERVER_KEY_HELP),
    curve_client_cert: Optional[str] = typer.Option(None, "--curve-client-cert", help=CLIENT_CERT_HELP),
    sign_key: Optional[str] = typer.Option(None, "--sign-key", help="With --nats: " + SIGN_KEY_HELP),
    insecure: bool = typer.Option(False, "--insecure", help="With --nats: " + INSECURE_HELP),
) -> None:
    """Check that the address answers, the topic matches, batches arrive and decode, seqs are
    continuous, heartbeats come, replay and describe answer, and published hashes recompute.
    Exit 1 if any check fails."""
    from kvevents.doctor.zeromq import run_doctor

    if nats_url is not None:  # kvevents.cli.nats: stream, sources, snapshot ages, lag
        from kvevents.cli.nats import doctor_nats

        return doctor_nats(nats_url, stream, timeout, as_json, sign_key, insecure)
    if endpoint is None:
        user_error("missing ENDPOINT (or --nats URL --stream NAME)")
    from kvevents.zeromq.wire import check_endpoint

    for what, ep in (("ENDPOINT", endpoint), ("--replay", replay)):
        if ep is not None:
            try:
                check_endpoint(ep)  # a malformed address is a usage error (2), not a failed check
            except ValueError as exc:
                user_error(f"{what}: {exc}")
    from kvevents.zeromq.security import client_context

    ctx = client_context(curve_client(curve_server_key, curve_client_cert))  # CURVE: every probe socket a client
    rep = run_doctor(
        endpoint, replay=replay, page_size=page_size, topic=topic, timeout=timeout, salts=salt, context=ctx
    )
    if as_json:
        sys.stdout.write(json.dumps(rep.as_dict(), default=str) + "\n")
    else:
        print_checks(f"kvevents doctor {endpoint}" + (f" (replay {replay})" if replay else ""), rep.checks)
    failed = [ch.name for ch in rep.checks if ch.status == "fail"]
    if failed:
        raise CheckFailed(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")
