"""`conformance drive`: the seed's invariant end to end, through an OpenAI-compatible server.

Fresh random prompts go to `/v1/completions` as token-id lists (model = adapter, `cache_salt`
for the tenant); the published BlockStored events of each prompt are found by their tokens.
Checks: one prompt under two adapters publishes the same hashes, under two salts different
ones, and the hashes equal the profile's for those tokens. The stream rules run on the side.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from kvevents.conformance.profiles import NotCheckable, Profile
from kvevents.conformance.report import Report, RuleResult, Status
from kvevents.conformance.stream import StreamObserver, StreamOptions
from kvevents.events import BlockStored, KVEventBatch

__all__ = ["DriveOptions", "PageFinder", "drive", "post_json", "server_root"]


@dataclass
class DriveOptions:
    """The server, the stream it publishes, and what to send."""

    http: str
    endpoint: str
    replay: str | None = None
    page_size: int = 16
    profile: str = "contract"
    model: str | None = None  # the base model (None: the first of GET /v1/models)
    adapters: tuple[str, str] = ("lora-a", "lora-b")
    salts: tuple[str, str] = ("tenant-a", "tenant-b")
    pages: int = 4
    seed: int = 20
    timeout: float = 5.0
    vocab: int = 30000
    hash_seed: str | None = None
    lora_path: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


class PageFinder:
    """Collects BlockStored events; finds the published hash of each full page of a prompt."""

    def __init__(self) -> None:
        self.stored: list[BlockStored] = []

    def __call__(self, seq: int, batch: KVEventBatch) -> None:
        self.stored.extend(ev for ev in batch.events if isinstance(ev, BlockStored))

    def find(self, tokens: list[int], page_size: int, since: int) -> list[int | None]:
        """Hash per full page of `tokens` from events stored at index >= since (None: not seen)."""
        n = len(tokens) // page_size
        where = {tuple(tokens[i * page_size : (i + 1) * page_size]): i for i in range(n)}
        out: list[int | None] = [None] * n
        for ev in self.stored[since:]:
            bs = ev.block_size
            for j, h in enumerate(ev.block_hashes):
                page = where.get(tuple(ev.token_ids[j * bs : (j + 1) * bs]))
                if page is not None and out[page] is None:
                    out[page] = h
        return out


def post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """POST a JSON body, return the JSON answer; ValueError naming the URL on any failure."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:200].decode("utf-8", "replace")
        raise ValueError(f"POST {url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ValueError(f"POST {url}: {getattr(exc, 'reason', exc)}") from None


def server_root(http: str) -> str:
    """The server's root URL: `--http` as given, or the usual OpenAI base URL `http://HOST:8000/v1`
    (its /v1 is not doubled into /v1/v1/completions)."""
    root = http.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _base_model(http: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(f"{http}/v1/models", timeout=timeout) as resp:
            data = json.loads(resp.read())
        return str(data["data"][0]["id"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"GET {http}/v1/models: {getattr(exc, 'reason', exc)} (give --model)") from None


class _Driver:
    def __init__(self, opts: DriveOptions, obs: StreamObserver) -> None:
        self.opts = opts
        self.obs = obs
        self.finder = PageFinder()
        obs.checker.listeners.append(self.finder)
        self.rng = random.Random(opts.seed)
        root = server_root(opts.http)
        self.url = root + "/v1/completions"
        self.model = opts.model or _base_model(root, opts.timeout)

    def prompt(self) -> list[int]:
        return [self.rng.randrange(1, self.opts.vocab) for _ in range(self.opts.pages * self.opts.page_size)]

    def send(self, tokens: list[int], *, model: str | None = None, salt: str | None = None) -> list[int | None]:
        """Send one prompt; the hash of each of its pages published after it was sent."""
        since = len(self.finder.stored)
        body: dict[str, Any] = {"model": model or self.model, "prompt": tokens, "max_tokens": 1, **self.opts.extra_body}
        if salt is not None:
            body["cache_salt"] = salt
        post_json(self.url, body, self.opts.timeout)
        deadline = time.monotonic() + self.opts.timeout
        while True:
            found = self.finder.find(tokens, self.opts.page_size, since)
            if all(h is not None for h in found) or time.monotonic() > deadline:
                return found
            self.obs.pump(0.05)


def _missing(found: list[int | None], what: str) -> str | None:
    lost = [i for i, h in enumerate(found) if h is None]
    if lost:
        return f"{what}: no BlockStored for pages {lost} within the timeout"
    return None


def _rule(name: str, problems: list[str], checked: int, ok_detail: str) -> RuleResult:
    if problems:
        return RuleResult(name, Status.FAIL, problems[0], checked, problems)
    return RuleResult(name, Status.PASS, ok_detail, checked)


#: (prompt tokens, the page hashes published for it, salt, adapter) of the four prompts sent
_Sent = tuple[list[int], list[int | None], str | None, str | None]

_AFTER_JOIN = ("adapters-same-hash", "salts-differ", "hashes-profile")


def drive(opts: DriveOptions) -> Report:
    """Run the drive checks; the stream rules judged over the same window come after them."""
    with StreamObserver(_stream_options(opts)) as obs:
        d = _Driver(opts, obs)
        profile = obs.checker.profile
        joined = _join(d)
        results = [_events_rule(joined, opts)]
        if not joined:
            results.extend(
                RuleResult(r, Status.NOT_CHECKABLE, "no events seen for the warm-up prompts") for r in _AFTER_JOIN
            )
            stream = obs.finish()
            return Report("conformance drive", results + stream.results, dict(stream.figures))
        a, b = opts.adapters
        x = d.prompt()
        ha, hb = d.send(x, model=a), d.send(x, model=b)
        results.append(_adapters_rule(profile, a, b, ha, hb))
        s1, s2 = opts.salts
        y = d.prompt()
        h1, h2 = d.send(y, salt=s1), d.send(y, salt=s2)
        results.append(_salts_rule(s1, s2, h1, h2))
        sent: list[_Sent] = [(x, ha, None, a), (x, hb, None, b), (y, h1, s1, None), (y, h2, s2, None)]
        results.append(_profile_rule(profile, opts.page_size, sent))
        stream = obs.finish()
    report = Report("conformance drive", results + stream.results, dict(stream.figures))
    report.figures["model"] = d.model
    return report


def _stream_options(opts: DriveOptions) -> StreamOptions:
    """The stream observed beside the prompts: no duration of its own, replies bounded by the timeout."""
    return StreamOptions(
        opts.endpoint,
        opts.replay,
        opts.page_size,
        duration=0.0,
        profile=opts.profile,
        reply_timeout=min(opts.timeout, 2.0),
        hash_seed=opts.hash_seed,
        lora_path=opts.lora_path,
    )


def _join(d: _Driver) -> bool:
    """Warm-up prompts until one's events are all seen (a SUB misses what is sent before it joins)."""
    for _ in range(3):
        if all(h is not None for h in d.send(d.prompt())):
            return True
    return False


def _events_rule(joined: bool, opts: DriveOptions) -> RuleResult:
    """drive-events: does the stream carry the pages of the warm-up prompts at all?"""
    problems = (
        []
        if joined
        else [f"no BlockStored with the pages of 3 warm-up prompts on {opts.endpoint} (the worker behind {opts.http}?)"]
    )
    return _rule("drive-events", problems, 1, "the stream carries each prompt's pages")


def _adapters_rule(profile: Profile, a: str, b: str, ha: list[int | None], hb: list[int | None]) -> RuleResult:
    """adapters-same-hash: one prompt under two adapters publishes the same hashes (if the profile says so)."""
    problems = [p for p in (_missing(ha, f"adapter {a}"), _missing(hb, f"adapter {b}")) if p]
    if not problems and ha != hb and profile.adapter_invariant:
        page = next(i for i, (p, q) in enumerate(zip(ha, hb)) if p != q)
        problems.append(f"page {page}: {ha[page]} under {a}, {hb[page]} under {b} (extra_key moved a published hash)")
    if profile.adapter_invariant:
        return _rule("adapters-same-hash", problems, len(ha), f"{len(ha)} pages, same hashes under {a} and {b}")
    return RuleResult(
        "adapters-same-hash",
        Status.NOT_OFFERED,
        f"the {profile.name} profile hashes the "
        "adapter into every block: adapters publish different hashes (hashes-profile checks them)",
    )


def _salts_rule(s1: str, s2: str, h1: list[int | None], h2: list[int | None]) -> RuleResult:
    """salts-differ: one prompt under two salts shares no published hash."""
    problems = [p for p in (_missing(h1, f"salt {s1}"), _missing(h2, f"salt {s2}")) if p]
    same = [i for i, (p, q) in enumerate(zip(h1, h2)) if p is not None and p == q]
    if not problems and same:
        problems.append(f"pages {same}: the same hashes under salts {s1} and {s2}")
    return _rule("salts-differ", problems, len(h1), f"{len(h1)} pages, different hashes under {s1} and {s2}")


def _profile_rule(profile: Profile, page_size: int, sent: list[_Sent]) -> RuleResult:
    """hashes-profile: each prompt's published hashes equal the profile's chain for its tokens."""
    problems: list[str] = []
    for tokens, got, salt, lora in sent:
        lost = _missing(got, f"lora={lora} salt={salt}")
        if lost:
            problems.append(lost)
            continue
        try:
            want = profile.prompt_hashes(tokens, page_size, salt=salt, lora=lora)
        except NotCheckable:
            continue
        except ValueError as exc:
            problems.append(f"cannot compute the {profile.name} hashes: {exc}")
            break
        for page, (g, w) in enumerate(zip(got, want)):
            if g is not None and g != w:
                problems.append(f"lora={lora} salt={salt} page {page}: published {g}, {profile.name} says {w}")
                break
    return _rule("hashes-profile", problems, 4, f"the four prompts' hashes equal the {profile.name} chain")
