"""End-to-end processing latency: quantiles of (FIN time - publish time) over a sliding window.

Theory of operation
-------------------
nsqd keeps, per channel, two quantile streams that take turns: every half window
(``--e2e-processing-latency-window-time`` / 2) the older one is cleared and becomes the one
written to; a query merges both, so it covers between half a window and a whole one.
nsqd's streams are CKMS-targeted summaries; here each half keeps a uniform reservoir of at
most ``RESERVOIR`` samples plus its true count, and a query takes weighted quantiles over
both reservoirs (a sample stands for ``count / len(reservoir)`` finished messages). Memory
is bounded (2 x 1024 floats per channel) and the error is that of a 1024-sample estimate —
well inside what an operator reads off a p99 graph. A FIN costs one clock read and, once a
reservoir is full, one random draw.

``result()`` is nsqd's JSON shape (``count`` and ``percentiles`` of ``{quantile, value}``,
values in ns); ``merged()`` gives a topic's figure from its channels' samples, as nsqd's
``AggregateChannelE2eProcessingLatency`` does.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterable
from typing import Any

RESERVOIR = 1024
_TIMESTAMP = struct.Struct(">q")

NO_LATENCY: dict[str, Any] = {"count": 0, "percentiles": None}


class _Half:
    __slots__ = ("count", "samples")

    def __init__(self) -> None:
        self.count = 0
        self.samples: list[float] = []

    def reset(self) -> None:
        self.count = 0
        self.samples = []

    def add(self, value: float) -> None:
        self.count += 1
        if len(self.samples) < RESERVOIR:
            self.samples.append(value)
        else:
            slot = random.randrange(self.count)
            if slot < RESERVOIR:
                self.samples[slot] = value

    def weighted(self) -> list[tuple[float, float]]:
        if not self.samples:
            return []
        weight = self.count / len(self.samples)
        return [(v, weight) for v in self.samples]


class LatencyWindow:
    """One channel's e2e latency over ``window`` ns for the given ``percentiles``."""

    def __init__(self, window: int, percentiles: list[float]) -> None:
        self.percentiles = list(percentiles)
        self._move = max(window // 2, 1)
        self._halves = (_Half(), _Half())
        self._current = 0
        self._last_move = time.monotonic_ns()

    def _roll(self, now: int) -> None:
        while now > self._last_move + self._move:
            self._current ^= 1
            self._halves[self._current].reset()
            self._last_move += self._move

    def add_record(self, record: bytes, wall_now: int | None = None) -> None:
        """A message was finished: its record starts with the publish time (ns)."""
        self.add_timestamp(_TIMESTAMP.unpack_from(record)[0], wall_now)

    def add_timestamp(self, published: int, wall_now: int | None = None) -> None:
        """A message published at ``published`` (wall-clock ns) was finished."""
        self._roll(time.monotonic_ns())
        self._halves[self._current].add(float((wall_now or time.time_ns()) - published))

    def weighted(self) -> list[tuple[float, float]]:
        self._roll(time.monotonic_ns())
        return self._halves[0].weighted() + self._halves[1].weighted()

    def count(self) -> int:
        self._roll(time.monotonic_ns())
        return self._halves[0].count + self._halves[1].count

    def result(self) -> dict[str, Any]:
        return summarize(self.percentiles, self.count(), self.weighted())


def summarize(percentiles: list[float], count: int, weighted: list[tuple[float, float]]) -> dict[str, Any]:
    """nsqd's ``quantile.Result`` for weighted samples."""
    weighted = sorted(weighted)
    total = sum(w for _, w in weighted)
    out = []
    for p in percentiles:
        value = 0.0
        if weighted:
            target, seen = p * total, 0.0
            value = weighted[-1][0]
            for v, w in weighted:
                seen += w
                if seen >= target:
                    value = v
                    break
        out.append({"quantile": go_float(p), "value": go_float(value)})
    return {"count": count, "percentiles": out}


def go_float(value: float) -> int | float:
    """A float64 as Go's ``encoding/json`` writes it: whole numbers (below 1e21) without
    ``.0`` (``1``, ``1500000``), so they go out as ints; others as they are."""
    return int(value) if value.is_integer() and abs(value) < 1e21 else value


def merged(windows: Iterable[LatencyWindow | None]) -> dict[str, Any]:
    """A topic's latency: its channels' samples together (``NO_LATENCY`` if none track it)."""
    present = [w for w in windows if w is not None]
    if not present:
        return dict(NO_LATENCY)
    samples: list[tuple[float, float]] = []
    for w in present:
        samples += w.weighted()
    return summarize(present[0].percentiles, sum(w.count() for w in present), samples)
