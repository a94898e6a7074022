"""`conformance hash`: check any implementation of the event chain through a JSON-lines adapter.

Protocol: the kit starts COMMAND once and writes one request per line on its stdin,
`{"id", "token_ids", "page_size", "extra_key", "cache_salt", "prior"}` (prior: 64 hex chars of
the previous page's event digest, or null for a chain head). The adapter answers each with one
line `{"id": ..., "hashes": [...]}` (each hash 64 hex chars, or the published int64) or
`{"id": ..., "error": "..."}` for input the contract rejects (a token id outside 0..2^32-1).
An answer line is at most MAX_LINE bytes and UTF-8; the adapter runs in a process group of its
own, killed when the run ends (kvevents.conformance.adapter).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvevents.conformance.adapter import MAX_LINE, Adapter
from kvevents.conformance.report import Report, RuleResult, Status
from kvevents.hashing import Namespace, event_hashes, to_int64

__all__ = [
    "GOLDEN_PATH",
    "AdapterNeverAnswered",
    "HashCase",
    "all_cases",
    "check_answer",
    "golden_cases",
    "property_cases",
    "run_adapter",
]


def _golden_dir() -> Path:
    """The golden vectors shipped with the package (kvevents/schemas/golden), else the checkout's."""
    shipped = Path(__file__).resolve().parents[1] / "schemas" / "golden"
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[2] / "schemas" / "golden"


GOLDEN_PATH = _golden_dir() / "sglang-0.5.20.json"


@dataclass(frozen=True)
class HashCase:
    """One request to the adapter and the event hashes it must answer (None: it must refuse)."""

    id: str
    group: str  # "golden", "direct", "property", "chunked", "reject"
    token_ids: list[int]
    page_size: int
    extra_key: str | None = None
    cache_salt: str | None = None
    prior: str | None = None
    expected: list[str] | None = field(default=None, compare=False)
    extra: dict[str, Any] | None = field(default=None, compare=False)  # profile fields (vLLM: hash_algo, ...)
    int_form: str = "int64-first8"  # how an int answer is read: contract int64, or vLLM's "uint64-last8"

    def request(self) -> dict[str, Any]:
        req = {
            "id": self.id,
            "token_ids": self.token_ids,
            "page_size": self.page_size,
            "extra_key": self.extra_key,
            "cache_salt": self.cache_salt,
            "prior": self.prior,
        }
        if self.extra:
            req.update(self.extra)
        return req

    def published(self, hex_digest: str) -> int:
        """The integer form of one expected digest, as this case's engine publishes it."""
        if self.int_form == "uint64-last8":
            return int(hex_digest[-16:], 16)
        return to_int64(hex_digest)


def golden_cases(path: Path | str = GOLDEN_PATH) -> list[HashCase]:
    """The public vectors: every golden case (whole and as a child after its parent), the direct ones."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"golden file {path}: {exc}") from None
    out = [c for case in data.get("cases", []) for c in _chain_cases(case)]
    out += _direct_cases(data.get("direct", {}))
    out.append(HashCase("reject/token_u32_max_plus_1", "reject", [1, 2**32], 4))
    out.append(HashCase("reject/token_negative", "reject", [1, -1], 4))
    return out


def _chain_cases(case: dict) -> list[HashCase]:
    """One golden case: alone, or with a parent as the parent, the child after it and the two whole."""
    inp, ev = case["inputs"], case["events"]
    ps, ek, salt = inp["page_size"], inp["extra_key"], inp["cache_salt"]
    tokens, hexes = list(inp["tokens"]), list(ev["event_hashes_hex"])
    parent_tokens, parent_hex = inp.get("parent_tokens"), ev.get("parent_event_hashes_hex")
    if not parent_tokens:
        return [HashCase(case["id"], "golden", tokens, ps, ek, salt, None, hexes)]
    parent_tokens, parent_hex = list(parent_tokens), list(parent_hex)
    return [
        HashCase(f"{case['id']}/parent", "golden", parent_tokens, ps, ek, salt, None, parent_hex),
        HashCase(f"{case['id']}/child", "golden", tokens, ps, ek, salt, parent_hex[-1], hexes),
        HashCase(f"{case['id']}/whole", "golden", parent_tokens + tokens, ps, ek, salt, None, parent_hex + hexes),
    ]


def _direct_cases(d: dict) -> list[HashCase]:
    """The golden file's direct calls: short and empty inputs, a partial page, an explicit prior, u32 max."""
    out: list[HashCase] = []
    simple: tuple[tuple[str, str, list[int]], ...] = (
        ("get_hash_str_[1,2,3]_page_size_4", "direct/[1,2,3]_ps4", [1, 2, 3]),
        ("get_hash_str_empty_page_size_4", "direct/empty_ps4", []),
        ("partial_page_plain_ps4_tokens_5..10", "direct/partial_ps4_5..10", list(range(5, 11))),
    )
    for key, name, tokens in simple:
        if key in d:
            out.append(HashCase(name, "direct", tokens, 4, expected=list(d[key])))
    ep = d.get("explicit_prior")
    if ep:
        ek, salt = ep["namespace"]
        expected = list(ep["get_hash_str_with_prior"])
        out.append(
            HashCase("direct/explicit_prior", "direct", list(ep["tokens"]), 4, ek, salt, ep["prior_hex"], expected)
        )
    if "token_u32_max" in d:
        out.append(
            HashCase("direct/token_u32_max", "direct", [2**32 - 1], 4, expected=list(d["token_u32_max"]["list"]))
        )
    return out


_NAMES = ("lora-a", "lora-b", "", "a", "ab", "tenant-a", "tenant-b", "ünïcode-ключ", "x" * 40)


def property_cases(seed: int = 20, n: int = 120) -> list[HashCase]:
    """Generated cases (fixed seed): random tokens, page sizes and namespaces, and chunked
    continuations whose prior is the last event hash of the chunk before (expected from kvevents)."""
    rng = random.Random(seed)
    out: list[HashCase] = []
    for i in range(n):
        ps = rng.choice((1, 2, 3, 4, 5, 8, 16, 32, 64))
        ntok = rng.randint(0, 6 * ps + ps - 1)
        top = rng.choice((100, 32000, 2**32 - 1))
        toks = [rng.randint(0, top) for _ in range(ntok)]
        ek = rng.choice((None, None) + _NAMES)
        salt = rng.choice((None, None, "") + _NAMES)
        ns = Namespace(ek, salt)
        out.append(HashCase(f"property/{i:03d}", "property", toks, ps, ek, salt, None, event_hashes(toks, ps, ns)))
        full = len(toks) // ps
        if full >= 2:  # chunked continuation: a head chunk, then the rest from its last hash
            cut = rng.randint(1, full - 1) * ps
            head = event_hashes(toks[:cut], ps, ns)
            out.append(
                HashCase(
                    f"chunked/{i:03d}",
                    "chunked",
                    toks[cut:],
                    ps,
                    ek,
                    salt,
                    head[-1],
                    event_hashes(toks[cut:], ps, ns, prior=head[-1]),
                )
            )
    return out


def all_cases(seed: int = 20, n: int = 120, golden: Path | str = GOLDEN_PATH) -> list[HashCase]:
    return golden_cases(golden) + property_cases(seed, n)


def _norm(h: Any) -> Any:
    return h.lower() if isinstance(h, str) else h


def check_answer(case: HashCase, answer: dict[str, Any]) -> str | None:
    """None when the answer is right, else one line saying what differs (the first differing page)."""
    if case.expected is None:
        if "error" in answer:
            return None
        return f"token ids outside 0..2^32-1 must be refused with an error, got hashes {str(answer.get('hashes'))[:60]}"
    if "error" in answer:
        return f"adapter refused a valid input: {str(answer['error'])[:120]}"
    got = answer.get("hashes")
    if not isinstance(got, list):
        return f"answer has no 'hashes' list: {json.dumps(answer)[:120]}"
    want = case.expected
    for page, (g, w) in enumerate(zip(got, want)):
        if isinstance(g, bool) or not isinstance(g, (str, int)):
            return f"page {page}: hash must be 64 hex chars or an int64, got {g!r}"
        if isinstance(g, int):
            if g != case.published(w):
                return f"page {page}: got int {g}, want {case.published(w)} ({w[:16]}...)"
        elif _norm(g) != w:
            return f"page {page}: got {g[:16]}..., want {w[:16]}..."
    if len(got) != len(want):
        return f"{len(got)} hashes for {len(want)} pages"
    return None


MAX_SILENT = 3  # consecutive unanswered cases before the adapter is given up on


class AdapterNeverAnswered(ValueError):
    """The adapter command exited before its first answer (a misspelled path, a crash at import):
    nothing was checked, so it is an input error, not a failed check."""


def _iter_results(adapter: Adapter, cases: list[HashCase], timeout: float) -> Iterator[tuple[HashCase, str | None]]:
    dead: str | None = None
    silent = 0
    answered = False
    for number, case in enumerate(cases, 1):
        if dead is not None:
            yield case, f"not run: {dead}"
            continue
        if not adapter.send(case.request()):
            code = adapter.proc.poll()
            if not answered:
                raise AdapterNeverAnswered(
                    f"--cmd: the adapter exited (code {code}) before its first answer{_tail(adapter)}"
                )
            dead = f"adapter exited (code {code}) before this case" + _tail(adapter)
            yield case, dead
            continue
        kind, value = adapter.receive(case.id, timeout)
        if kind == "exited" and not answered:
            raise AdapterNeverAnswered(
                f"--cmd: the adapter exited (code {value}) before its first answer{_tail(adapter)}"
            )
        answered = answered or kind != "timeout"
        silent = silent + 1 if kind == "timeout" else 0
        if silent >= MAX_SILENT:
            dead = f"adapter gave no answer to {MAX_SILENT} cases in a row"
        if kind == "ok":
            yield case, check_answer(case, value)
        elif kind == "timeout":
            yield case, f"no answer within {timeout:g} s"
        elif kind == "garbled":
            yield case, f"answer is not a JSON object line: {value!r}"
        elif kind == "bad_utf8":
            yield case, f"invalid UTF-8 at case {number} (byte {value} of the answer line)"
        elif kind == "too_long":
            dead = f"adapter wrote an answer line over {value} bytes at case {number} ({case.id})"
            yield case, f"answer line over {value} bytes (no newline within the limit): adapter stopped"
        else:
            dead = f"adapter exited (code {value})" + _tail(adapter)
            yield case, dead


def _tail(adapter: Adapter) -> str:
    adapter.stderr_done(1.0)
    tail = " | ".join(adapter.stderr_tail[-2:])
    return f"; stderr: {tail[:200]}" if tail else ""


def run_adapter(
    command: str,
    cases: list[HashCase] | None = None,
    *,
    timeout: float = 5.0,
    cwd: str | None = None,
    max_line: int = MAX_LINE,
) -> Report:
    """Run every case through the adapter; one rule per case group, each case's failure as an example.
    An answer line over `max_line` bytes stops the adapter (kvevents.conformance.adapter)."""
    if cases is None:
        cases = all_cases()
    adapter = Adapter(command, cwd=cwd or os.getcwd(), max_line=max_line)
    groups: dict[str, RuleResult] = {}
    t0 = time.monotonic()
    failed = 0
    try:
        for case, problem in _iter_results(adapter, cases, timeout):
            rule = groups.setdefault(case.group, RuleResult(f"hash-{case.group}", Status.PASS))
            rule.checked += 1
            if problem is not None:
                failed += 1
                rule.status = Status.FAIL
                rule.examples.append(f"{case.id}: {problem}")
    finally:
        adapter.close()
    for rule in groups.values():
        bad = len(rule.examples)
        rule.detail = f"{rule.checked - bad}/{rule.checked} cases right" + (
            f"; first: {rule.examples[0]}" if bad else ""
        )
    report = Report("conformance hash", list(groups.values()))
    report.figures = {"cases": len(cases), "failed": failed, "seconds": round(time.monotonic() - t0, 2)}
    return report
