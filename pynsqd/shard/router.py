"""Where a shard's topics live, and how it reaches a topic another shard owns.

A topic belongs to one shard (``node/placement.py``). A publish for another shard's topic
goes into that shard's inbound ring (``crossshard.Outbound``), and before this shard stores
a publish of its own it stores what its inbound rings hold that was sent before
(``catch_up``, ``inbound.py``); a connection that subscribes
to one is relayed there: this shard hands the far end of a socketpair to the owner through
the supervisor (``HandOff``) and pumps bytes between it and the client (``relay.py``).
"""

from __future__ import annotations

import logging
import socket
import weakref
from collections.abc import Callable

from pynsqd.node.control import ControlChannel
from pynsqd.node.messages import HandOff
from pynsqd.node.placement import Placement
from pynsqd.shard.crossshard import Outbound
from pynsqd.shard.inbound import Inbound
from pynsqd.shard.relay import Relay, Relayable

log = logging.getLogger("pynsqd.shard")


def _no_inbound() -> None:
    """Nothing to catch up with: the shard has no inbound rings yet."""


class ShardRouter:
    """The ``Router`` of a shard's broker on a node (``broker.Router``)."""

    def __init__(self, placement: Placement, outbound: Outbound, control: ControlChannel) -> None:
        self.placement = placement
        self.outbound = outbound
        self.control = control
        self.relays = 0  # connections relayed to another shard
        self.live_relays: weakref.WeakSet[Relay] = weakref.WeakSet()
        self.catch_up: Callable[[], None] = _no_inbound  # Router.catch_up (``catch_up_with``)

    def catch_up_with(self, inbound: Inbound) -> None:
        """``catch_up`` stores what ``inbound`` holds from here on (the inbound is built on
        the broker, after it). Bound once: on the owner's hot path, no call in between."""
        self.catch_up = inbound.catch_up

    def owner(self, topic: str) -> int:
        return self.placement.owner(topic)

    def forward(self, topic: str, records: list[bytes], body_bytes: int, delay_ns: int) -> None:
        self.outbound.put(self.placement.owner(topic), topic, records, body_bytes, delay_ns)

    def relay(self, client: Relayable, owner: int, unread: bytes) -> None:
        """Move ``client`` to ``owner`` through a socketpair we pump (``relay.py``)."""
        here, there = socket.socketpair()
        state = client.relay_state()
        try:
            self.control.send(HandOff(owner, state, unread), [there.fileno()])
        finally:
            there.close()
        transport = client.transport
        client.detach()
        self.relays += 1
        assert transport is not None  # a connection that runs commands has its transport
        self.live_relays.add(Relay(transport, here, client.decoder))
        log.debug("client(%s) relayed to shard %d", client.remote_address, owner)
