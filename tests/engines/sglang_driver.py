"""SGLang 0.5.20's own code against kvevents, in one process inside the SGLang venv.

Run by tests/engines/test_sglang_real.py as `python sglang_driver.py TMPDIR`; prints one
KVEVENTS-REPORT line (harness.Report). Real: RadixCache + PagedTokenToKVPoolAllocator +
MHATokenToKVPool on CPU, SGLang's ZmqEventPublisher (PUB + replay ROUTER), its msgspec decoder
(engine_run.py), its plug-in loading and SchedulerKvEventsPublisher (sglang_plugin_checks.py).
Stand-in: standins.TORCHVISION, installed before any SGLang import.
"""

from __future__ import annotations

import standins

STANDINS = [standins.stub_torchvision()]  # before any SGLang import

import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import msgspec  # noqa: E402
from engine_run import PER_STEP, STEPS, EngineSide, run_engine  # noqa: E402
from harness import Report  # noqa: E402
from sglang.srt.disaggregation.kv_events import KVEventBatch, ZmqEventPublisher  # noqa: E402
from sglang_engine import Request, SGLangEngine, tree_truth, workload  # noqa: E402

from kvevents.plugins.sglang import convert_events  # noqa: E402

_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def serve(engine: SGLangEngine, reqs: Sequence[Request]) -> None:
    for r in reqs:
        engine.serve(r)


def decode_same(payload: bytes, events: list) -> bool:
    """SGLang's decoder reads kvevents' bytes as the very events SGLang's cache emitted."""
    batch = _DECODER.decode(payload)
    return [msgspec.structs.asdict(e) for e in batch.events] == [msgspec.structs.asdict(e) for e in events]


def side() -> EngineSide:
    return EngineSide(
        source="sglang",
        new_engine=SGLangEngine,
        new_publisher=lambda ep, rp: ZmqEventPublisher(
            attn_dp_rank=0, endpoint=ep, replay_endpoint=rp, buffer_steps=5000
        ),
        publish=lambda pub, events: pub.publish(KVEventBatch(ts=time.time(), events=events)),
        shutdown=lambda pub: pub.shutdown(),
        serve=serve,
        flush=SGLangEngine.flush,
        take_events=SGLangEngine.take_events,
        truth=lambda engine: tree_truth(engine.cache),
        to_kvevents=lambda events: convert_events(events)[0],
        decode_same=decode_same,
        requests=workload(STEPS * PER_STEP),
    )


def main(tmp: str) -> None:
    report = Report("sglang")
    report.standins = list(STANDINS)
    run_engine(side(), report, tmp)
    import sglang_plugin_checks

    t = time.monotonic()
    with report.guard("plugin_run"):
        sglang_plugin_checks.main(report, tmp)
    report.figures["plugin_s"] = round(time.monotonic() - t, 2)
    report.emit()


if __name__ == "__main__":
    main(sys.argv[1])
