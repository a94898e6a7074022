"""`kvevents serve` (simulated engine workers publishing their events) and `kvevents tail`."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any, Optional

import typer

from kvevents.cli.app import CheckFailed, app, user_error
from kvevents.cli.keys import (
    ALLOW_HELP,
    CLIENT_CERT_HELP,
    SECRET_HELP,
    SERVER_KEY_HELP,
    curve_client,
    curve_server,
    show_plain_bind_once,
)

_STARTED = "kvevents serve:"


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@app.command()
def serve(
    endpoint: str = typer.Option("tcp://127.0.0.1:5557", help="Live PUB endpoint of worker 0 (worker i: port + i)."),
    replay_endpoint: Optional[str] = typer.Option(
        None,
        help="Replay ROUTER endpoint of worker 0 (worker i: port + i); default: the port after the last "
        "live port (5558 for one worker); '' for none.",
    ),
    topic: str = typer.Option("", help="Topic frame of every message."),
    workers: int = typer.Option(1, min=1, max=64, help="Simulated workers, one publisher each (as DP ranks)."),
    rate: float = typer.Option(200.0, min=0.0, help="Requests per second over all workers (0: as fast as possible)."),
    duration: Optional[float] = typer.Option(None, min=0.0, help="Stop after this many seconds (default: Ctrl-C)."),
    seed: int = typer.Option(0, help="Workload seed (worker i uses seed + i)."),
    page_size: int = typer.Option(16, min=1, help="Tokens per page."),
    capacity_pages: int = typer.Option(4096, min=1, help="Device pages per worker (eviction beyond)."),
    heartbeat: float = typer.Option(1.0, min=0.0, help="Heartbeat interval in seconds (0: none)."),
    bind: bool = typer.Option(True, help="Bind the live endpoint (the project default: loopback, bound)."),
    metrics_port: Optional[int] = typer.Option(
        None, help="Serve Prometheus metrics on 127.0.0.1:PORT (0: a free port, printed)."
    ),
    engine: str = typer.Option(
        "contract",
        "--engine",
        help="contract: emit by the kvevents contract; vllm: what a vLLM "
        "0.33 worker emits (its hash chain as uint64, extra_keys, group_idx, one removal per hash; "
        "no snapshots, no heartbeats).",
    ),
    hash_algo: str = typer.Option(
        "sha256", "--hash-algo", help="--engine vllm: vLLM's prefix-caching hash, sha256 | sha256_cbor."
    ),
    epoch_in_batch: bool = typer.Option(
        False,
        "--epoch-in-batch",
        help="Add the epoch as a 4th batch element (only tolerant decoders read it; "
        "vLLM-, SGLang- and Dynamo-style strict decoders reject it). Default: the strict 3-element batch.",
    ),
    curve_secret: Optional[str] = typer.Option(None, "--curve-secret", help=SECRET_HELP),
    curve_allow: Optional[str] = typer.Option(None, "--curve-allow", help=ALLOW_HELP),
    http: Optional[str] = typer.Option(
        None,
        "--http",
        help="Also serve an OpenAI-compatible /v1/completions on HOST:PORT (0: a free port) feeding worker w0: "
        "token-id prompts, model = adapter, cache_salt; GET /metrics in the engine's metric names.",
    ),
    prefill_us: float = typer.Option(
        10.0, "--prefill-us-per-token", min=0.0, help="--http: microseconds per uncached prompt token."
    ),
    decode_ms: float = typer.Option(1.0, "--decode-ms-per-token", min=0.0, help="--http: milliseconds per max_tokens."),
    max_running: int = typer.Option(8, "--max-running", min=1, help="--http: requests run at once; the rest queue."),
) -> None:
    """Run simulated engine workers, each publishing its KV events; a status line per second."""
    from kvevents.sim.worker import ENGINES, Workload, make_worker, serve_and_publish
    from kvevents.zeromq.publisher import Publisher
    from kvevents.zeromq.wire import check_endpoint, offset_endpoint

    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        user_error(f"--metrics-port must be in 0..65535 (0: a free port), got {metrics_port}")
    if engine not in ENGINES or hash_algo not in ("sha256", "sha256_cbor"):
        user_error(
            f"--engine must be one of {', '.join(ENGINES)} and --hash-algo sha256 or sha256_cbor, got {engine!r} / {hash_algo!r}"
        )
    try:
        check_endpoint(endpoint)
    except ValueError as exc:
        user_error(f"--endpoint: {exc}")
    default_replay = replay_endpoint is None
    if replay_endpoint is None:
        replay_endpoint = _after(endpoint, workers)
    try:
        if replay_endpoint:
            check_endpoint(replay_endpoint)
        lives = [offset_endpoint(endpoint, i) for i in range(workers)]
        replays = [offset_endpoint(replay_endpoint, i) for i in range(workers)] if replay_endpoint else []
    except ValueError as exc:  # a port past 65535 (the default replay port, or a rank's offset port)
        what = (
            "--replay-endpoint (default: the port after the last live port)"
            if default_replay
            else (f"with {workers} workers (rank r uses port + r)")
        )
        user_error(f"{what}: {exc}")
    clash = sorted(set(lives) & set(replays) - {e for e in lives if e.endswith(":*") or e.endswith(":0")})
    if len(set(lives)) < workers and not endpoint.endswith((":*", ":0")):
        user_error(
            f"--endpoint {endpoint!r} gives every worker the same address: use tcp://HOST:PORT or inproc:// "
            "(ranks offset the port / suffix the name) or one worker"
        )
    if clash:
        user_error(
            f"live and replay endpoints collide on {clash[0]} with {workers} workers (rank r uses port + r): "
            f"give --replay-endpoint a port >= live port + {workers}"
        )
    curve_server(curve_secret, curve_allow)  # bad key files: one line, exit 2
    show_plain_bind_once()
    sims, pubs, loads = [], [], []
    try:
        for i in range(workers):
            pubs.append(
                Publisher(
                    endpoint=endpoint,
                    replay_endpoint=replay_endpoint or None,
                    topic=topic,
                    dp_rank=i,
                    bind=bind,
                    heartbeat_interval_s=heartbeat if engine == "contract" else 0.0,
                    snapshots=engine == "contract",
                    metrics_port=metrics_port,
                    epoch_in_batch=epoch_in_batch,
                    curve_secret_key_file=curve_secret,
                    curve_allow_dir=curve_allow,
                )
            )
            metrics_port = pubs[0].metrics_port  # 0 picked a free port: the other ranks share it
            sims.append(
                make_worker(
                    engine, f"w{i}", page_size=page_size, capacity_pages=capacity_pages, hash_algo=hash_algo, dp_rank=i
                )
            )
            loads.append(iter(Workload(seed + i, page_size=page_size)))
    except BaseException:
        for p in pubs:
            p.close(0)
        raise
    for i, p in enumerate(pubs):
        metrics = f" metrics http://127.0.0.1:{p.metrics_port}/metrics" if p.metrics_port is not None else ""
        _out(
            f"{_STARTED} worker w{i} dp_rank {i} live {p.endpoint} replay {p.replay_endpoint or '-'} "
            f"epoch {p.epoch}{metrics}"
        )
    lock, web = threading.Lock(), None  # --http: its thread and the loop below take turns on the workers
    if http is not None:
        from kvevents.sim.http import BASE_MODEL, serve_http
        from kvevents.sim.timing import SimTiming

        try:
            timing = SimTiming(prefill_us * 1e-6, decode_ms * 1e-3, max_running)
            web = serve_http(http, sims[0], pubs[0], lock, timing=timing, engine=engine, page_size=page_size,
                             capacity_pages=capacity_pages)  # fmt: skip
        except ValueError as exc:
            for p in pubs:
                p.close(0)
            user_error(str(exc))
        _out(
            f"{_STARTED} http {web.url}/v1/completions (worker w0; model {BASE_MODEL} = no adapter; {web.url}/metrics)"
        )
    stop = {"flag": False}

    def _on_term(signum: int, frame: Any) -> None:
        stop["flag"] = True

    old = signal.signal(signal.SIGTERM, _on_term)
    t0 = time.monotonic()
    next_status = t0 + 1.0
    served = 0
    interval = 1.0 / rate if rate > 0 else 0.0
    next_req = t0
    try:
        while not stop["flag"]:
            now = time.monotonic()
            if duration is not None and now - t0 >= duration:
                break
            if now >= next_status:
                _out(_status_line(now - t0, served, sims, pubs))
                next_status += 1.0
            if interval and now < next_req:
                time.sleep(min(next_req - now, max(0.0, next_status - now), 0.05))
                continue
            k = served % workers
            with lock:
                serve_and_publish(sims[k], next(loads[k]), pubs[k])
            served += 1
            next_req += interval
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        if web is not None:
            web.close()
        unsent = sum(p.close(1.0) for p in pubs)
        _out(_status_line(time.monotonic() - t0, served, sims, pubs) + f" stopped unsent={unsent}")


def _after(endpoint: str, workers: int) -> str:
    """Default replay endpoint: the port right after the last worker's live port (`*` stays `*`)."""
    head, _, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and port.isdigit() and int(port) > 0:
        return f"{head}:{int(port) + workers}"
    if endpoint.startswith("tcp://"):
        return endpoint  # ephemeral: the OS picks a port
    return endpoint + "-replay"


def _status_line(elapsed: float, served: int, sims: list, pubs: list) -> str:
    stats = [p.stats() for p in pubs]
    tok = sum(s.tokens for s in sims) or 1
    hit = sum(s.device_hit_tokens for s in sims) / tok
    return (
        f"t={elapsed:5.1f}s requests={served} batches={sum(s['batches_published'] for s in stats)} "
        f"events={sum(s['events_published'] for s in stats)} dropped={sum(s['dropped_queue_full'] for s in stats)} "
        f"live_blocks={sum(s['live_blocks'] for s in stats)} replays={sum(s['replay_requests'] for s in stats)} "
        f"snapshots={sum(s['snapshot_requests'] for s in stats)} device_hit={hit:.1%}"
    )


def _summary(batch: Any) -> str:
    counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
    stored = removed = 0
    for ev in batch.events:
        name = type(ev).__name__
        counts[name] = counts.get(name, 0) + 1
        if name == "BlockStored":
            stored += len(ev.block_hashes)
        elif name == "BlockRemoved":
            removed += len(ev.block_hashes)
    return (
        f"events={len(batch.events)} stored={counts['BlockStored']}(+{stored} pages) "
        f"removed={counts['BlockRemoved']}(-{removed} pages) cleared={counts['AllBlocksCleared']}"
    )


_NOTICES = {  # what each subscriber counter means, said once per notice
    "gaps": "a seq was skipped",
    "replays_requested": "asked the replay endpoint for the missed batches",
    "unrecoverable_gaps": "missed batches the replay endpoint no longer holds: state lost",
    "restarts": "the publisher restarted (new epoch): state resyncs",
    "bad_payloads": "an undecodable payload was skipped",
}
SILENCE_HINT_S = 3.0  # no message at all for this long: say what `kvevents doctor` would check


def _notice_detail(key: str, seen: int, replay: Optional[str]) -> str:
    """One line on what a counter's rise means for the user of `tail`."""
    if key == "losses":
        if seen == 0 and not replay:
            return "joined mid-stream without --replay: earlier batches not seen"
        return "batches missed and not repaired" + ("" if replay else " (no --replay endpoint to ask)")
    return _NOTICES.get(key, "")


def _silence_hint(endpoint: str, replay: Optional[str], waited: float) -> str:
    doctor = f"kvevents doctor {endpoint}" + (f" --replay {replay}" if replay else "")
    return (
        f"kvevents tail: nothing from {endpoint} after {waited:.0f}s: is a publisher running and bound there, "
        f"with topic prefix matching? `{doctor}` checks the address, topic, batches and heartbeats"
    )


@app.command()
def tail(
    endpoint: str = typer.Argument(..., help="Live PUB endpoint to connect to."),
    replay: Optional[str] = typer.Option(None, "--replay", help="Replay ROUTER endpoint (gap repair, snapshots)."),
    topic: str = typer.Option("", help="Topic prefix to subscribe to."),
    as_json: bool = typer.Option(
        False, "--json", help="One JSON object per line (notices too); else notices go to stderr."
    ),
    count: Optional[int] = typer.Option(None, min=1, help="Exit after this many batches."),
    duration: Optional[float] = typer.Option(
        None, min=0.0, help="Exit after this many seconds; exit 1 if nothing at all was received."
    ),
    stale_after: float = typer.Option(5.0, help="Report the publisher stale after this much silence (s, > 0)."),
    curve_server_key: Optional[str] = typer.Option(None, "--curve-server-key", help=SERVER_KEY_HELP),
    curve_client_cert: Optional[str] = typer.Option(None, "--curve-client-cert", help=CLIENT_CERT_HELP),
) -> None:
    """Print every batch of a publisher (or JSONL), with gap / replay / restart / heartbeat notices.

    A line "connecting to ..." and the notices go to stderr (with --json the notices are JSON lines
    on stdout); after 3 s without any message a hint says what `kvevents doctor` checks.
    """
    import logging

    from kvevents.events import event_to_dict
    from kvevents.zeromq.subscriber import Delivery, Source, Subscriber
    from kvevents.zeromq.wire import check_endpoint

    if not stale_after > 0:
        user_error(f"--stale-after must be > 0 seconds, got {stale_after:g}")
    for what, ep in (("ENDPOINT", endpoint), ("--replay", replay)):
        try:
            if ep or what == "ENDPOINT":
                check_endpoint(ep)  # type: ignore[arg-type]
        except ValueError as exc:
            user_error(f"{what}: {exc}")
    source = Source(endpoint, replay or None, endpoint, curve=curve_client(curve_server_key, curve_client_cert))
    # this command prints its own stale notice: the subscriber's log line would say it twice
    logging.getLogger("kvevents.zeromq.subscriber").setLevel(logging.ERROR)
    sub = Subscriber([source], topic=topic, stale_after_s=stale_after)
    _note(
        f"kvevents tail: connecting to {endpoint}"
        + (f" (replay {replay})" if replay else " (no --replay: batches missed are not repaired)")
        + (f" topic prefix {topic!r}" if topic else "")
    )
    seen = 0
    last = sub.counters()
    was_stale = hinted = False
    t0 = time.monotonic()

    def emit(obj: dict, text: str) -> None:
        _out(json.dumps(obj, separators=(",", ":")) if as_json else text)

    def notice(obj: dict, text: str) -> None:
        if as_json:
            _out(json.dumps(obj, separators=(",", ":")))
        else:
            _note(text)

    try:
        while (count is None or seen < count) and (duration is None or time.monotonic() - t0 < duration):
            items = sub.poll(0.1)
            now = sub.counters()
            for key in ("gaps", "replays_requested", "unrecoverable_gaps", "restarts", "bad_payloads", "losses"):
                if now[key] > last[key]:
                    detail = _notice_detail(key, seen, replay)
                    notice(
                        {"type": "notice", "what": key, "count": now[key], "detail": detail},
                        f"! {key.replace('_', ' ')} (total {now[key]})" + (f": {detail}" if detail else ""),
                    )
            last = now
            for it in items:
                if not isinstance(it, Delivery):
                    emit(
                        {"type": "reset", "source": it.source, "dp_rank": it.dp_rank, "reason": it.reason},
                        f"! reset rank={it.dp_rank} reason={it.reason}: drop state, resync follows",
                    )
                    continue
                b = it.batch
                if not b.events and it.kind != "snapshot":
                    emit(
                        {"type": "heartbeat", "seq": it.seq, "kind": it.kind, "dp_rank": it.dp_rank, "epoch": it.epoch},
                        f"seq={it.seq} {it.kind} rank={it.dp_rank} heartbeat",
                    )
                else:
                    emit(
                        {
                            "type": "batch",
                            "seq": it.seq,
                            "kind": it.kind,
                            "ts": b.ts,
                            "dp_rank": it.dp_rank,
                            "epoch": it.epoch,
                            "topic": it.topic,
                            "events": [event_to_dict(e) for e in b.events],
                        },
                        f"seq={it.seq} {it.kind} rank={it.dp_rank} {_summary(b)}",
                    )
                seen += 1
                if count is not None and seen >= count:
                    break
            status = sub.status()[endpoint]
            waited = time.monotonic() - t0
            if status.last_heard is None and not hinted and waited >= SILENCE_HINT_S:
                hinted = True
                _note(_silence_hint(endpoint, replay, waited))
            stale = status.stale and status.last_heard is not None  # never heard: the hint above said it
            if stale and not was_stale:
                notice({"type": "notice", "what": "stale"}, f"! no message for {stale_after:g}s: publisher stale")
            was_stale = stale
    except KeyboardInterrupt:
        return
    finally:
        sub.stop()
    if seen == 0:
        raise CheckFailed(
            f"tail: nothing received from {endpoint} in {time.monotonic() - t0:.1f}s"
            + ("" if hinted else f" (`kvevents doctor {endpoint}` says why)")
        )


def _note(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
