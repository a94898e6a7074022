"""Deprecated path, kept for one release: the publisher lives in `kvevents.zeromq.publisher`."""

from kvevents.zeromq.publisher import Publisher, PublisherConfig, publish_steps

__all__ = ["Publisher", "PublisherConfig", "publish_steps"]
