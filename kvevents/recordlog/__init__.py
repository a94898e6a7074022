"""Record log: an append-only, crash-safe file of received event batches, and tools over it.

Layout and the resync rule are in `kvevents.recordlog.format`. Reading streams; damage (a CRC
failure, a torn last record) is skipped with a RecordLogWarning.

Logs and live streams (they import kvevents.zeromq, so they are not imported here):
`kvevents.recordlog.live` records a feed into a log, fetches a replay buffer, drains a stored
stream; `kvevents.recordlog.republish` publishes a log again through a Publisher.
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
