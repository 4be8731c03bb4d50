"""The message object a consumer's handler receives, and what it answers through."""

from __future__ import annotations

from typing import Protocol


class Responder(Protocol):
    """Where a ``Message``'s answers go: the consumer that received it, on the connection it
    came on (``consumer.Answers``)."""

    @property
    def nsqd_address(self) -> str: ...

    def finish(self, message: Message) -> None:
        """Send FIN (the message was marked answered)."""

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        """Send REQ (the message was marked answered)."""

    def touch(self, message: Message) -> None:
        """Send TOUCH."""


class Message:
    """One delivered message: ``id`` (16 ASCII bytes), ``body``, ``attempts`` (1 on the first
    delivery), ``timestamp`` (ns since the epoch, set by nsqd at publish) and ``nsqd_address``.

    Answer it once with ``finish()`` or ``requeue()``; ``touch()`` as often as needed before
    that. When the handler returns without answering, the consumer answers for it (FIN, or
    REQ when the handler returned False or raised) unless ``disable_auto_response()`` was
    called — then the application must answer, possibly later, from anywhere on the loop.
    """

    __slots__ = ("_auto", "_responder", "attempts", "body", "id", "responded", "timestamp")

    def __init__(self, responder: Responder, msg_id: bytes, body: bytes, attempts: int, timestamp: int) -> None:
        self._responder = responder
        self.id = msg_id
        self.body = body
        self.attempts = attempts
        self.timestamp = timestamp
        self.responded = False
        self._auto = True

    @property
    def nsqd_address(self) -> str:
        return self._responder.nsqd_address

    @property
    def auto_response(self) -> bool:
        return self._auto

    def disable_auto_response(self) -> None:
        """The handler's return will not FIN/REQ this message; the application will."""
        self._auto = False

    def finish(self) -> None:
        """FIN: the message is done. A second answer raises ``RuntimeError``."""
        self._respond()
        self._responder.finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: deliver the message again after ``delay`` seconds (default: the consumer's
        requeue delay times attempts, capped). ``backoff`` counts it as a failure for backoff."""
        self._respond()
        self._responder.requeue(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset the message's timeout on nsqd (not after it was answered)."""
        if self.responded:
            raise RuntimeError(f"message {self.id!r} already answered")
        self._responder.touch(self)

    def _respond(self) -> None:
        if self.responded:
            raise RuntimeError(f"message {self.id!r} already answered")
        self.responded = True

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, body={self.body[:40]!r})"
