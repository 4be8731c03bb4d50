"""What a channel needs from a subscribed connection: ``Subscriber``, the interface ``ClientV2`` provides.

The channel (``channel.py``) hands a consumer messages up to its ``capacity()`` (RDY minus
what it holds in flight), writes their frames straight into its ``output()`` buffer and then
calls ``delivered(count)``, or, with a sample rate, passes the chosen messages to
``deliver``. It keeps the consumer's counters (``in_flight_count``, ``finish_count``,
``requeue_count``) as FIN, REQ and timeouts happen, and closes it when the channel is
deleted.
"""

from __future__ import annotations

from typing import Protocol


class Subscriber(Protocol):
    in_flight_count: int  # messages of this consumer the channel holds in flight
    finish_count: int
    requeue_count: int

    @property
    def msg_timeout(self) -> int:
        """Nanoseconds before a message it holds times out (its IDENTIFY's, or the node's)."""

    @property
    def sample_rate(self) -> int:
        """Percent of the messages it wants delivered (0: all)."""

    def capacity(self) -> int:
        """How many more messages it may be sent now."""

    def output(self) -> bytearray:
        """The buffer its frames are written into."""

    def delivered(self, count: int) -> None:
        """``count`` messages were framed into ``output()``: send them."""

    def deliver(self, messages: list[tuple[bytes, int]]) -> None:
        """Frame and send these (record, attempts) pairs (sampled deliveries)."""

    def close_for_channel_delete(self) -> None:
        """Its channel was deleted: close the connection."""
