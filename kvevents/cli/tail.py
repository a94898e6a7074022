"""`kvevents tail ENDPOINT`: every batch of a publisher (a kvevents.zeromq.subscriber.Subscriber) as a
line or a JSON object, with gap / replay / restart / heartbeat / stale notices."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import typer

from kvevents.cli.app import CheckFailed, user_error
from kvevents.cli.options import CURVE_CLIENT_CERT, CURVE_SERVER_KEY, check_endpoint, curve_client
from kvevents.cli.output import err_line, out_line

_NOTICES = {  # what each subscriber counter means, said once per notice
    "gaps": "a seq was skipped",
    "replays_requested": "asked the replay endpoint for the missed batches",
    "unrecoverable_gaps": "missed batches the replay endpoint no longer holds: state lost",
    "restarts": "the publisher restarted (new epoch): state resyncs",
    "bad_payloads": "an undecodable payload was skipped",
    "bad_replies": "the replay endpoint answered in neither replay framing",
    "requests_abandoned": "a replay, snapshot or describe request got no usable answer in time: "
    "given up, live batches go on",
}
_COUNTERS = (
    "gaps", "replays_requested", "unrecoverable_gaps", "restarts", "bad_payloads", "losses",
    "bad_replies", "requests_abandoned",
)  # fmt: skip
SILENCE_HINT_S = 3.0  # no message at all for this long: say what `kvevents doctor` would check


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
    curve_server_key: Optional[str] = CURVE_SERVER_KEY,
    curve_client_cert: Optional[str] = CURVE_CLIENT_CERT,
) -> None:
    """Print every batch of a publisher (or JSONL), with gap / replay / restart / heartbeat notices.

    A line "connecting to ..." and the notices go to stderr (with --json the notices are JSON lines
    on stdout); after 3 s without any message a hint says what `kvevents doctor` checks. Ctrl-C:
    a line of what was shown, exit 130.
    """
    import logging

    from kvevents.zeromq.subscriber import Source, Subscriber

    if not stale_after > 0:
        user_error(f"--stale-after must be > 0 seconds, got {stale_after:g}")
    check_endpoint("ENDPOINT", endpoint)
    check_endpoint("--replay", replay, empty_ok=True)
    source = Source(endpoint, replay or None, endpoint, curve=curve_client(curve_server_key, curve_client_cert))
    # this command prints its own stale notice: the subscriber's log line would say it twice
    logging.getLogger("kvevents.zeromq.subscriber").setLevel(logging.ERROR)
    sub = Subscriber([source], topic=topic, stale_after_s=stale_after)
    err_line(
        f"kvevents tail: connecting to {endpoint}"
        + (f" (replay {replay})" if replay else " (no --replay: batches missed are not repaired)")
        + (f" topic prefix {topic!r}" if topic else "")
    )
    watch = _Tail(sub, endpoint, replay, as_json, stale_after)
    try:
        watch.run(count, duration)
    except KeyboardInterrupt:
        err_line(f"kvevents tail: interrupted after {watch.seen} batches in {time.monotonic() - watch.t0:.1f}s")
        raise typer.Exit(130) from None
    finally:
        sub.stop()
    if watch.seen == 0:
        raise CheckFailed(
            f"tail: nothing received from {endpoint} in {time.monotonic() - watch.t0:.1f}s"
            + ("" if watch.hinted else f" (`kvevents doctor {endpoint}` says why)")
        )


class _Tail:
    """One subscriber's deliveries and counter rises, printed; `seen` counts the batches shown."""

    def __init__(self, sub: Any, endpoint: str, replay: Optional[str], as_json: bool, stale_after: float) -> None:
        self.sub, self.endpoint, self.replay = sub, endpoint, replay
        self.as_json, self.stale_after = as_json, stale_after
        self.seen = 0
        self.last = sub.counters()
        self.was_stale = self.hinted = False
        self.framing: Optional[str] = None  # the replay framing last announced
        self.t0 = time.monotonic()

    def run(self, count: Optional[int], duration: Optional[float]) -> None:
        """Poll until `count` batches were shown or `duration` s passed (either None: no limit)."""
        while (count is None or self.seen < count) and (duration is None or time.monotonic() - self.t0 < duration):
            items = self.sub.poll(0.1)
            self._counter_notices()
            for it in items:
                self._show(it)
                if count is not None and self.seen >= count:
                    break
            self._silence_notices()

    def _emit(self, obj: dict, text: str) -> None:
        out_line(json.dumps(obj, separators=(",", ":")) if self.as_json else text)

    def _notice(self, obj: dict, text: str) -> None:
        if self.as_json:
            out_line(json.dumps(obj, separators=(",", ":")))
        else:
            err_line(text)

    def _framing_notice(self) -> None:
        """A notice naming the replay framing the publisher's replies use, when first seen or changed."""
        from kvevents.zeromq.framing import FRAMINGS, framing_label

        framing = self.sub.status()[self.endpoint].replay_framing
        if framing is not None and framing != self.framing:
            self.framing = framing
            obj = {"type": "notice", "what": "replay_framing", "framing": framing, "detail": FRAMINGS.get(framing, "")}
            self._notice(obj, f"! replay framing {framing_label(framing)}")

    def _counter_notices(self) -> None:
        """A notice per subscriber counter that rose since the last poll."""
        self._framing_notice()
        now = self.sub.counters()
        for key in _COUNTERS:
            if now[key] > self.last[key]:
                detail = self.sub.status()[self.endpoint].problem or _notice_detail(key, self.seen, self.replay)
                self._notice(
                    {"type": "notice", "what": key, "count": now[key], "detail": detail},
                    f"! {key.replace('_', ' ')} (total {now[key]})" + (f": {detail}" if detail else ""),
                )
        self.last = now

    def _show(self, it: Any) -> None:
        """A reset, a heartbeat or a batch (the last two count as seen)."""
        from kvevents.events import event_to_dict
        from kvevents.zeromq.subscriber import Delivery

        if not isinstance(it, Delivery):
            self._emit(
                {"type": "reset", "source": it.source, "dp_rank": it.dp_rank, "reason": it.reason},
                f"! reset rank={it.dp_rank} reason={it.reason}: drop state, resync follows",
            )
            return
        b = it.batch
        if not b.events and it.kind != "snapshot":
            self._emit(
                {"type": "heartbeat", "seq": it.seq, "kind": it.kind, "dp_rank": it.dp_rank, "epoch": it.epoch},
                f"seq={it.seq} {it.kind} rank={it.dp_rank} heartbeat",
            )
        else:
            obj = {"type": "batch", "seq": it.seq, "kind": it.kind, "ts": b.ts, "dp_rank": it.dp_rank}
            obj.update(epoch=it.epoch, topic=it.topic, events=[event_to_dict(e) for e in b.events])
            self._emit(obj, f"seq={it.seq} {it.kind} rank={it.dp_rank} {_summary(b)}")
        self.seen += 1

    def _silence_notices(self) -> None:
        """The doctor hint once after SILENCE_HINT_S of never hearing anything; a stale notice on
        each fall silent of a publisher heard before."""
        status = self.sub.status()[self.endpoint]
        waited = time.monotonic() - self.t0
        if status.last_heard is None and not self.hinted and waited >= SILENCE_HINT_S:
            self.hinted = True
            err_line(
                f"kvevents tail: {status.problem}"
                if status.problem
                else _silence_hint(self.endpoint, self.replay, waited)
            )
        stale = status.stale and status.last_heard is not None  # never heard: the hint above said it
        if stale and not self.was_stale:
            self._notice(
                {"type": "notice", "what": "stale"}, f"! no message for {self.stale_after:g}s: publisher stale"
            )
        self.was_stale = stale


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
