"""The message object a consumer's handler receives."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pynsqd.client.consumer import Consumer, _Conn


class Message:
    """One delivered message: ``id`` (16 ASCII bytes), ``body``, ``attempts`` (1 on the first
    delivery), ``timestamp`` (ns since the epoch, set by nsqd at publish) and ``nsqd_address``.

    Answer it once with ``finish()`` or ``requeue()``; ``touch()`` as often as needed before
    that. When the handler returns without answering, the consumer answers for it (FIN, or
    REQ when the handler returned False or raised) unless ``disable_auto_response()`` was
    called — then the application must answer, possibly later, from anywhere on the loop.
    """

    __slots__ = ("_auto", "_conn", "_consumer", "attempts", "body", "id", "responded", "timestamp")

    def __init__(self, consumer: Consumer, conn: _Conn, msg_id: bytes, body: bytes, attempts: int,
                 timestamp: int) -> None:
        self._consumer = consumer
        self._conn = conn
        self.id = msg_id
        self.body = body
        self.attempts = attempts
        self.timestamp = timestamp
        self.responded = False
        self._auto = True

    @property
    def nsqd_address(self) -> str:
        return self._conn.address

    @property
    def auto_response(self) -> bool:
        return self._auto

    def disable_auto_response(self) -> None:
        """The handler's return will not FIN/REQ this message; the application will."""
        self._auto = False

    def finish(self) -> None:
        """FIN: the message is done. A second answer raises ``RuntimeError``."""
        self._respond()
        self._consumer._finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: deliver the message again after ``delay`` seconds (default: the consumer's
        requeue delay times attempts, capped). ``backoff`` counts it as a failure for backoff."""
        self._respond()
        self._consumer._requeue(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset the message's timeout on nsqd (not after it was answered)."""
        if self.responded:
            raise RuntimeError(f"message {self.id!r} already answered")
        self._consumer._touch(self)

    def _respond(self) -> None:
        if self.responded:
            raise RuntimeError(f"message {self.id!r} already answered")
        self.responded = True

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, body={self.body[:40]!r})"
