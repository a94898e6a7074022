"""`kvevents route`'s cost and load options (--policy, --prefill-load-scale, --temperature,
--metrics-url, --load-stale-after, --predicted-ttl) -> the service's RoutingOptions, one line and
exit 2 for a bad one."""

from __future__ import annotations

from collections.abc import Sequence

from kvevents.cli.app import user_error
from kvevents.consumers.cost import POLICIES, CostSettings
from kvevents.consumers.scraper import parse_metrics_urls
from kvevents.consumers.service.scoring import RoutingOptions

__all__ = ["POLICY_HELP", "routing_options"]

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
