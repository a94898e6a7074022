"""PublisherConfig: the publisher's settings, named as vLLM's KVEventsConfig / SGLang's publisher
config, validated before any socket opens (kvevents.zeromq.publisher re-exports it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvevents.zeromq.wire import check_endpoint, offset_endpoint

__all__ = ["PublisherConfig"]


class PublisherConfig(BaseModel):
    """Publisher settings, named as vLLM's KVEventsConfig / SGLang's publisher config.

    `snapshots` (our extension, default True) matters only with a `replay_endpoint`: True keeps
    the live-block view that KVE/SNAPSHOT serves (schemas/README.md, Transport), updated on every publish (about 3 us of
    interpreter time per batch of 32 single-page events; see benchmarks/bench_publisher.py).
    False is vLLM's feature set: the replay ring and the ROUTER stay (replay and KVE/DESCRIBE are
    answered, DESCRIBE's page size is learned from the first BlockStored), but no view is kept and
    a KVE/SNAPSHOT request gets no reply (counted in `rejected_requests`). A consumer then cannot
    heal a gap that replay cannot fill (a dropped batch, a restart, a start older than the ring):
    its snapshot request times out and it starts clean, counted as a loss, as with vLLM.
    Without a replay endpoint no view is kept either way (nothing could serve it).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    bind: bool | None = None  # None: the vLLM rule (bind wildcards, ipc, inproc; else connect)
    topic: str = ""
    buffer_steps: int = Field(10000, ge=0)
    hwm: int = Field(100000, ge=0)
    max_queue_size: int = Field(100000, ge=1)
    heartbeat_interval_s: float = Field(1.0, ge=0)
    # False: no heartbeat before the first batch, so a publisher that does not know its state yet (a
    # relay before its engine's first batch) does not announce a stream whose snapshot would be empty
    heartbeat_before_first: bool = True
    dp_rank: int = Field(0, ge=0)
    event_encoding: Literal["map", "array"] = "map"
    metrics_port: int | None = Field(None, ge=0, le=65535)  # 0: a free port (Publisher.metrics_port)
    epoch: int | None = Field(None, ge=0, le=2**63 - 1)  # None: random; set it to continue a stream
    # Off (default): batches are exactly [ts, events, rank] as vLLM/SGLang send, and consumers learn
    # the epoch from KVE/DESCRIBE. On: a 4th element carries it, which strict decoders reject.
    epoch_in_batch: bool = False
    snapshots: bool = True  # keep the live view for KVE/SNAPSHOT (needs replay_endpoint); see above
    # replay ROUTER bounds (zeromq/replay_server.py): jobs held by one peer and by all, and the time a
    # peer has to drain a reply before it loses the job (counted in jobs_expired)
    replay_jobs_per_peer: int = Field(4, ge=1)
    replay_max_jobs: int = Field(64, ge=1)
    replay_job_timeout_s: float = Field(10.0, gt=0)
    # opt-in CURVE (zeromq/security.py): the server certificate with its secret key
    # (`kvevents keys generate`), and a directory of allowed client public certificates (*.key);
    # no allow-list: any client holding the server's public key (encryption + server authentication)
    curve_secret_key_file: str | None = None
    curve_allow_dir: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_binds_loopback(cls, data: Any) -> Any:
        """Transport rule: the project's default endpoint (loopback) is bound; an explicit endpoint with
        `bind` unset follows the vLLM rule."""
        if isinstance(data, dict) and data.get("endpoint") is None and data.get("bind") is None:
            data = {**data, "bind": True}
            data.pop("endpoint", None)
        return data

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _usable_endpoint(cls, v: str | None) -> str | None:
        """A malformed endpoint or a tcp port > 65535 (libzmq would wrap it) is refused here."""
        return check_endpoint(v) if v else v

    @model_validator(mode="after")
    def _rank_port_fits(self) -> PublisherConfig:
        """dp_rank r offsets tcp ports by r: the offset port must stay <= 65535."""
        for ep in (self.endpoint, self.replay_endpoint):
            if ep:
                offset_endpoint(ep, self.dp_rank)
        if self.curve_allow_dir is not None and self.curve_secret_key_file is None:
            raise ValueError("curve_allow_dir needs curve_secret_key_file (the server's certificate)")
        return self

    def with_overrides(self, overrides: dict[str, Any]) -> PublisherConfig:
        """This config with keyword overrides applied (a new endpoint drops the default endpoint's bind)."""
        if not overrides:
            return self
        base = self.model_dump()
        if "endpoint" in overrides and "bind" not in overrides and "endpoint" not in self.model_fields_set:
            base.pop("bind")  # the bind came with the default endpoint, not with this one
        return PublisherConfig(**{**base, **overrides})
