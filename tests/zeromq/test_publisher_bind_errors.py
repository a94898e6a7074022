"""A publisher that cannot bind says why in words (errno names, not Linux numbers), naming the endpoint."""

from __future__ import annotations

import pytest

from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher


def test_a_taken_port_is_already_in_use() -> None:
    first = Publisher(endpoint=EPH, heartbeat_interval_s=0.0)
    try:
        with pytest.raises(
            ValueError, match=r"publisher endpoint 'tcp://127\.0\.0\.1:\d+': the address is already in use"
        ):
            Publisher(endpoint=first.endpoint, bind=True, heartbeat_interval_s=0.0)
    finally:
        first.close(0)


def test_a_taken_replay_port_names_the_replay_endpoint() -> None:
    first = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.0)
    try:
        assert first.replay_endpoint is not None
        with pytest.raises(ValueError, match="replay_endpoint|already in use") as err:
            Publisher(endpoint=EPH, replay_endpoint=first.replay_endpoint, heartbeat_interval_s=0.0)
        assert repr(first.replay_endpoint) in str(err.value) and "already in use" in str(err.value)
    finally:
        first.close(0)


def test_an_address_of_another_machine_cannot_be_bound() -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this machine; nothing is sent
    with pytest.raises(ValueError, match="the address is not on this machine"):
        Publisher(endpoint="tcp://192.0.2.1:5557", bind=True, heartbeat_interval_s=0.0)


def test_a_host_name_that_does_not_resolve_is_said_so() -> None:
    with pytest.raises(ValueError, match="the host cannot be resolved"):
        Publisher(endpoint="tcp://nohost.invalid:5557", bind=True, heartbeat_interval_s=0.0)
