"""RDY backoff: slowing a consumer down while its handler fails. Pure state, virtual time.

Theory of operation (NSQ's client guide, "Backoff"). A failed message (a handler error, or a
requeue with ``backoff=True``) raises the backoff level by one and starts a window of
``min(max_duration, multiplier * 2 ** (level - 1))`` seconds (``pynsqd.backoff.exponential``;
no jitter: NSQ's clients wait exactly this) in which the consumer holds RDY 0
on every connection. When the window ends the consumer "tests the water": RDY 1 on one
connection. The next result decides: a success lowers the level (at 0 normal RDY resumes),
a failure raises it; either way a new window starts unless the level reached 0. Results
reported while a window runs are ignored, so only one result counts per window.

``RdyBackoff`` holds no clock: callers pass ``now`` (seconds, any monotonic origin) and get an
action back — ``PAUSE`` (send RDY 0 everywhere, call ``on_timer`` at ``deadline``), ``TEST``
(RDY 1 on one connection), ``RESUME`` (normal RDY) — or None.
"""

from __future__ import annotations

import enum

from pynsqd.backoff import exponential


class State(enum.Enum):
    NORMAL = "normal"
    WAITING = "waiting"   # a backoff window is running: RDY 0 everywhere
    TESTING = "testing"   # the window ended: RDY 1 on one connection, waiting for a result


class Action(enum.Enum):
    PAUSE = "pause"
    TEST = "test"
    RESUME = "resume"


class RdyBackoff:
    """A consumer's RDY backoff state machine; see the module docstring."""

    def __init__(self, multiplier: float = 1.0, max_duration: float = 120.0) -> None:
        if multiplier < 0 or max_duration < 0:
            raise ValueError("backoff durations must be >= 0")
        self.multiplier = multiplier
        self.max_duration = max_duration
        self.level = 0
        self.state = State.NORMAL
        self.deadline: float | None = None

    @property
    def active(self) -> bool:
        return self.state is not State.NORMAL

    def interval(self) -> float:
        """The length of the current window."""
        return exponential(self.multiplier, self.max_duration, self.level)

    def _pause(self, now: float) -> Action:
        self.state = State.WAITING
        self.deadline = now + self.interval()
        return Action.PAUSE

    def result(self, success: bool, now: float) -> Action | None:
        """Report one message's outcome (FIN = success; REQ with backoff = failure)."""
        if self.state is State.WAITING:
            return None
        if self.state is State.NORMAL:
            if success:
                return None
            self.level = 1
            return self._pause(now)
        # TESTING: this result counts
        if success:
            self.level -= 1
            if self.level <= 0:
                self.level = 0
                self.state = State.NORMAL
                self.deadline = None
                return Action.RESUME
            return self._pause(now)
        if self.interval() < self.max_duration:
            self.level += 1
        return self._pause(now)

    def on_timer(self, now: float) -> Action | None:
        """Call at (or after) ``deadline``; returns ``TEST`` when the window is over."""
        if self.state is State.WAITING and self.deadline is not None and now >= self.deadline:
            self.state = State.TESTING
            self.deadline = None
            return Action.TEST
        return None
