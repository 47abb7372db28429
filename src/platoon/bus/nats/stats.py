"""The counters of one bridge, for logs and benchmarks."""

from __future__ import annotations

import msgspec


class BridgeStats(msgspec.Struct):
    """Counters of one bridge, for logs and benchmarks."""

    sent: int = 0
    received: int = 0
    echoes: int = 0
    duplicates: int = 0
    republished: int = 0
    ack_timeouts: int = 0  # durable publishes not acknowledged in time (each is sent again)
    undecodable: int = 0
    slow_consumer_drops: int = 0
    disconnects: int = 0
    unsent_at_close: int = 0
    unleased: int = 0  # events of an episode, dropped for want of its lease token
    offers_claimed: int = 0  # offers of work claimed, each of one event or a batch of several
    offers_unclaimed: int = 0  # offers a member took and did not claim in time (it hangs)
    offers_unheld: int = 0  # offers made while no consumer was in the group
    claims_too_late: int = 0  # offers this consumer claimed after the producer gave up on it
