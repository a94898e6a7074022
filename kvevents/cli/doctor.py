"""`kvevents doctor ENDPOINT` (or `--nats URL --stream NAME`): the checklist to run when events do not
arrive; the checks live in kvevents.doctor.zeromq and kvevents.doctor.nats. Exit 1 if one fails."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer

from kvevents.cli.app import CheckFailed, user_error
from kvevents.cli.options import (
    CURVE_CLIENT_CERT,
    CURVE_SERVER_KEY,
    NATS_STREAM,
    NatsFlags,
    check_endpoint,
    curve_client,
    nats_signed_flags,
)
from kvevents.cli.output import print_checks

PROFILE_HELP = (
    "Recompute published hashes as: contract, or a vLLM 0.33 stream's vllm (structure, links), "
    "vllm-sha256 | vllm-sha256_cbor (hashes too; PYTHONHASHSEED if set). Default: detected from the stream."
)


@nats_signed_flags
def doctor_cmd(
    endpoint: Optional[str] = typer.Argument(None, help="The publisher's live endpoint, e.g. tcp://127.0.0.1:5557."),
    nats_url: Optional[str] = typer.Option(
        None, "--nats", help="Check a NATS JetStream stream (URL) instead of an endpoint."
    ),
    stream: str = NATS_STREAM,
    replay: Optional[str] = typer.Option(None, "--replay", help="Its replay endpoint (replay, snapshot, describe)."),
    page_size: Optional[int] = typer.Option(
        None, "--page-size", "-p", help="Page size, to recompute published hashes."
    ),
    topic: Optional[str] = typer.Option(None, "--topic", help="The topic your consumer subscribes to."),
    timeout: float = typer.Option(3.0, "--timeout", help="Seconds to listen (and to wait for each answer)."),
    salt: list[str] = typer.Option([], "--salt", help="A tenant cache_salt chain heads may be seeded with."),
    profile: Optional[str] = typer.Option(None, "--profile", help=PROFILE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    curve_server_key: Optional[str] = CURVE_SERVER_KEY,
    curve_client_cert: Optional[str] = CURVE_CLIENT_CERT,
    nats_flags: NatsFlags = NatsFlags(),
) -> None:
    """The checklist for events that do not arrive; exit 1 if any check fails.

    It checks that the address answers, a PUB and a ROUTER sit at the endpoints with CURVE keys that
    fit, the topic matches, batches arrive and decode, seqs are continuous, heartbeats come, replay
    and describe answer, and published hashes recompute (under --profile, or the one detected)."""
    from kvevents.doctor.hashes import PROFILES
    from kvevents.doctor.zeromq import run_doctor
    from kvevents.zeromq.security import client_context

    nats_flags.check(nats_url)
    if profile is not None and profile not in PROFILES:
        user_error(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    if nats_url is not None and profile is not None:
        user_error("--profile applies to an ENDPOINT (a ZeroMQ publisher), not to --nats")
    if nats_url is not None:  # stream, sources, snapshot ages, lag
        return _doctor_nats(nats_url, stream, timeout, as_json, nats_flags, nats_flags.bus_key("doctor"))
    if endpoint is None:
        user_error("missing ENDPOINT (or --nats URL --stream NAME)")
    check_endpoint("ENDPOINT", endpoint)  # a malformed address is a usage error (2), not a failed check
    check_endpoint("--replay", replay)
    ctx = client_context(curve_client(curve_server_key, curve_client_cert))  # CURVE: every probe socket a client
    rep = run_doctor(
        endpoint,
        replay=replay,
        page_size=page_size,
        topic=topic,
        timeout=timeout,
        salts=salt,
        context=ctx,
        profile=profile,
    )
    _report(rep, f"kvevents doctor {endpoint}" + (f" (replay {replay})" if replay else ""), as_json)


def _doctor_nats(url: str, stream: str, timeout: float, as_json: bool, flags: NatsFlags, sign_key: Any) -> None:
    """`doctor --nats`: the JetStream checklist (kvevents.doctor.nats.nats_doctor); --give-up-after
    is how long NATS may stay unreachable (default: --timeout)."""
    from kvevents.doctor.nats import nats_doctor

    rep = nats_doctor(flags.options(url, "doctor"), stream, timeout=flags.give_up_after or timeout, sign_key=sign_key)
    _report(rep, f"kvevents doctor {rep.endpoint}", as_json)


def _report(rep: Any, title: str, as_json: bool) -> None:
    """The report as JSON or a table; a failed check is exit 1."""
    if as_json:
        sys.stdout.write(json.dumps(rep.as_dict(), default=str) + "\n")
    else:
        print_checks(title, rep.checks)
    failed = [ch.name for ch in rep.checks if ch.status == "fail"]
    if failed:
        raise CheckFailed(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")
