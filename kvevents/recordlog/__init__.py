"""Record log: an append-only, crash-safe file of received event batches, and tools over it.

Layout and the resync rule are in `kvevents.recordlog.format`. Reading streams; damage (a CRC
failure, a torn last record) is skipped with a RecordLogWarning.

Logs and live streams (they import kvevents.zeromq, so they are not imported here):
`kvevents.recordlog.live` records a feed into a log, fetches a replay buffer, drains a stored
stream; `kvevents.recordlog.republish` publishes a log again through a Publisher.


| file | what it owns |
|---|---|
| `crcshift.py` | CRC-32 arithmetic that lets a reader check any byte range from prefix CRCs (zlib's polynomial). |
| `export.py` | `log export --jsonl`: one JSON object per record, events decoded, for other tools. |
| `format.py` | Byte layout of a kvevents record log (version 1): the file header and the record frame. |
| `live.py` | Logs from live streams: a recording of a feed (`kvevents record`), a publisher's replay buffer pulled into ... |
| `rangecheck.py` | CRC checks of claimed record ranges that cost O(1) each, so resync after damage stays linear. |
| `reader.py` | Streaming reader: validates the header, yields records, skips damage with a warning. |
| `record.py` | Recording deliveries from a Subscriber into a log (duck-typed: no transport import here). |
| `repair.py` | Repair a damaged log: cut a torn tail (always), optionally rewrite without corrupt regions. |
| `replay.py` | Replay helpers independent of the transport: selecting records and pacing them in time. |
| `republish.py` | A record log published again (`kvevents replay`): through a real zeromq Publisher, new seqs, the original ... |
| `stats.py` | `log inspect` analysis: counts by kind, event type, medium and source; seq gaps; epochs; rates. |
| `verifiers.py` | Which verifier `log inspect --verify --profile P` runs: the contract's or a vLLM 0.33 stream's. |
| `verify.py` | `log inspect --verify`: check a recorded stream against the contract (schemas/README.md: "Event hashes", ... |
| `verify_vllm.py` | `log inspect --verify --profile vllm[-sha256/-sha256_cbor]`: check a recorded vLLM 0.33 stream. |
| `writer.py` | Append-only writer: one framed record per write; crash-safe up to the last, torn, record. |
"""

from kvevents.recordlog.export import iter_jsonl, record_to_dict
from kvevents.recordlog.format import (
    HEADER_SIZE,
    KINDS,
    MAGIC,
    VERSION,
    BadRecordError,
    Record,
    RecordLogError,
    RecordLogWarning,
)
from kvevents.recordlog.reader import Damage, RecordReader, read_records
from kvevents.recordlog.record import START_MODES, Recorder
from kvevents.recordlog.repair import RepairResult, repair_log
from kvevents.recordlog.replay import ApplyResult, apply_log, count_records, paced, parse_speed, select_records
from kvevents.recordlog.stats import LogStats, StatsCollector, inspect_log
from kvevents.recordlog.verify import ContractVerifier, VerifyReport, Violation, verify_log
from kvevents.recordlog.writer import RecordWriter

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "KINDS",
    "Record",
    "RecordLogError",
    "BadRecordError",
    "RecordLogWarning",
    "RecordWriter",
    "RecordReader",
    "Damage",
    "read_records",
    "Recorder",
    "START_MODES",
    "repair_log",
    "RepairResult",
    "inspect_log",
    "LogStats",
    "StatsCollector",
    "verify_log",
    "ContractVerifier",
    "VerifyReport",
    "Violation",
    "iter_jsonl",
    "record_to_dict",
    "select_records",
    "count_records",
    "paced",
    "parse_speed",
    "apply_log",
    "ApplyResult",
]
