"""`kvevents route`'s index and cost option bundles (kvevents.cli.flag_groups): how sources are read
and keyed (IndexFlags: --page-size, --lora-strict, --stale-after; KeyingFlags: --key-mode,
--medium-weight) and the cost and load options (CostFlags: --policy, --prefill-load-scale,
--temperature, --metrics-url, --load-stale-after, --predicted-ttl -> the service's RoutingOptions);
one line and exit 2 for a bad one. route files each bundle under its --help panel."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvevents.cli.app import user_error
from kvevents.cli.flag_groups import flag
from kvevents.consumers.cost import POLICIES, CostSettings
from kvevents.consumers.scraper import parse_metrics_urls
from kvevents.consumers.service.scoring import RoutingOptions

__all__ = ["POLICY_HELP", "CostFlags", "IndexFlags", "KeyingFlags", "routing_options"]

POLICY_HELP = (
    "cost: lowest prefill_load_scale x max(prefill + request - overlap credit, 0) + decode blocks "
    "(Dynamo's form); prefix: longest cached prefix first, load breaks ties."
)


def routing_options(
    policy: str,
    prefill_load_scale: float,
    temperature: float,
    metrics_url: Sequence[str],
    load_stale_after: float,
    predicted_ttl: float,
    publishers: Sequence[str] | None = None,
) -> RoutingOptions:
    """The options as RoutingOptions; `publishers` (names given to --publisher) catch a
    --metrics-url naming none of them."""
    if policy not in POLICIES:
        user_error(f"--policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not load_stale_after > 0:
        user_error(f"--load-stale-after must be > 0, got {load_stale_after}")
    if not 0 <= predicted_ttl <= 3600:
        user_error(f"--predicted-ttl must be 0..3600 seconds (0: no predictions), got {predicted_ttl}")
    try:
        cost = CostSettings(policy=policy, prefill_load_scale=prefill_load_scale, temperature=temperature)
        urls = parse_metrics_urls(metrics_url)
    except ValueError as exc:
        user_error(
            str(exc).replace("prefill_load_scale", "--prefill-load-scale").replace("temperature", "--temperature")
        )
    if publishers:
        unknown = sorted(set(urls) - set(publishers))
        if unknown:
            user_error(f"--metrics-url {unknown[0]}: no --publisher of that name (have {', '.join(publishers)})")
    return RoutingOptions(
        cost=cost, predicted_ttl_s=predicted_ttl, load_stale_after_s=load_stale_after, metrics_urls=urls
    )


@dataclass(frozen=True)
class CostFlags:
    """How route ranks workers: the cost and where load comes from."""

    policy: str = flag("cost", "--policy", help=POLICY_HELP)
    prefill_load_scale: float = flag(1.0, "--prefill-load-scale", help="The cost's weight of prefill blocks.")
    temperature: float = flag(0.0, "--temperature", help="> 0: draw the pick by softmax(-cost/T); 0: lowest.")
    metrics_url: list[str] = flag(
        [], "--metrics-url", help="NAME=URL: scrape that publisher's engine /metrics (vLLM or SGLang) for its load."
    )
    load_stale_after: float = flag(5.0, "--load-stale-after", help="Seconds before a load is load_stale.")
    predicted_ttl: float = flag(2.0, "--predicted-ttl", help="Seconds a routed request's pages count as predicted.")

    def routing(self, publishers: Sequence[str] | None) -> RoutingOptions:
        """RoutingOptions (routing_options: checked)."""
        return routing_options(
            self.policy,
            self.prefill_load_scale,
            self.temperature,
            self.metrics_url,
            self.load_stale_after,
            self.predicted_ttl,
            publishers,
        )


@dataclass(frozen=True)
class IndexFlags:
    """How route's index reads its sources: page size, adapters, when a source is stale."""

    page_size: int = flag(16, "--page-size", help="Tokens per page, as the engines use (>= 1).")
    lora_strict: bool = flag(
        True, "--lora-strict/--no-lora-strict", help="Credit only copies of the request's lora_name."
    )
    stale_after: float = flag(5.0, "--stale-after", help="Seconds without a message before a source is stale.")

    def check(self) -> None:
        if self.page_size < 1:
            user_error(f"--page-size must be >= 1, got {self.page_size}")
        if not self.stale_after > 0:
            user_error(f"--stale-after must be > 0, got {self.stale_after}")


@dataclass(frozen=True)
class KeyingFlags:
    """How route keys a publisher's blocks and credits the media they are held on."""

    key_mode: list[str] = flag(
        [],
        "--key-mode",
        metavar="[NAME=]MODE",
        help="MODE contract, tokens or auto: how a publisher's blocks are keyed "
        "(auto, the default: detected from its first stored blocks; tokens: any engine, e.g. vLLM); "
        "a bare MODE sets it for every publisher not named.",
    )
    medium_weight: list[str] = flag(
        [],
        "--medium-weight",
        help="NAME=W: the credit of a page held on medium NAME (repeatable; W >= 0). Defaults: GPU 1.0, "
        "CPU_PINNED and CPU (host memory) 0.8, STORAGE, DISK, EXTERNAL and FS 0.5, any other 0.5.",
    )

    def modes(self, sources: Sequence[Any]) -> tuple[str, dict[str, str]]:
        """--key-mode values -> (the default mode, {publisher name: mode})."""
        from kvevents.consumers.keying import parse_key_modes

        try:
            return parse_key_modes(self.key_mode, [s.name or "" for s in sources])
        except ValueError as exc:
            user_error(str(exc))

    def weights(self) -> dict[str, float]:
        """--medium-weight NAME=W values over the defaults."""
        from kvevents.consumers.router import parse_medium_weights

        try:
            return parse_medium_weights(self.medium_weight)
        except ValueError as exc:
            user_error(str(exc))
