"""nsqadmin's own sampling of ``/stats``: message rates without graphite.

Theory of operation
-------------------
``Sampler.run`` wakes every ``--stats-sample-interval``, asks the cluster for its producers
and each producer's ``/stats?format=json&include_clients=false``, and records, per topic
and per topic/channel, the cluster-wide ``message_count`` with the time it was read. A
rate point is the difference of two consecutive readings divided by the time between them
(a count that went down — a node restarted, a channel was deleted and re-created — gives
0, not a negative rate). The last ``POINTS`` readings are kept, so the graphs cover the
last few minutes from the moment nsqadmin started. The last sample's per-topic summary
(depth, messages, channel count, paused, rate) is kept too, so the topics page can show a
row per topic without asking every node again. A failed sample keeps the previous data
and records the warning; the loop never dies of an upstream error.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from typing import Any

from pynsqd.admin.cluster import AllFailed, Cluster

POINTS = 150

Key = tuple[str, str]  # (topic, channel or "")


class Sampler:
    """Periodic cluster-wide counters; ``series``/``summary`` are read by the API."""

    def __init__(self, cluster: Cluster, interval_s: float, log: logging.Logger) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.log = log
        self.readings: dict[Key, collections.deque[tuple[float, int]]] = {}
        self.topics: dict[str, dict[str, Any]] = {}
        self.sampled_at = 0.0
        self.warning = ""
        self.samples = 0

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            await self.sample_once()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def sample_once(self) -> None:
        try:
            producers, errors = await self.cluster.producers()
            stats, more = await self.cluster.producer_stats(producers, include_clients=False) \
                if producers else ([], [])
        except AllFailed as exc:
            if str(exc) != self.warning:  # once per change, not once per interval
                self.log.warning("sampling /stats failed: %s", exc)
            self.warning = str(exc)
            return
        except Exception:  # an upstream answering nonsense must not stop the graphs
            self.log.exception("sampling /stats failed")
            return
        self.warning = "; ".join(errors + more)
        self.record(time.time(), [data for _, data in stats])

    def record(self, now: float, node_stats: list[dict[str, Any]]) -> None:
        """Add one reading from every node's ``/stats`` document."""
        counts: dict[Key, int] = collections.defaultdict(int)
        topics: dict[str, dict[str, Any]] = {}
        for data in node_stats:
            for t in data.get("topics") or []:
                name = t["topic_name"]
                counts[(name, "")] += int(t.get("message_count", 0))
                row = topics.setdefault(name, {"depth": 0, "message_count": 0, "channels": set(),
                                               "paused": False, "in_flight_count": 0, "nodes": 0})
                row["depth"] += int(t.get("depth", 0))
                row["message_count"] += int(t.get("message_count", 0))
                row["paused"] = row["paused"] or bool(t.get("paused"))
                row["nodes"] += 1
                for c in t.get("channels") or []:
                    counts[(name, c["channel_name"])] += int(c.get("message_count", 0))
                    row["channels"].add(c["channel_name"])
                    row["in_flight_count"] += int(c.get("in_flight_count", 0))
        for key, count in counts.items():
            readings = self.readings.get(key)
            if readings is None:
                readings = self.readings[key] = collections.deque(maxlen=POINTS)
            readings.append((now, count))
        for gone in [k for k in self.readings if k not in counts]:
            del self.readings[gone]
        for name, row in topics.items():
            row["channels"] = len(row["channels"])
            row["rate"] = self.rate_now((name, ""))
        self.topics = topics
        self.sampled_at = now
        self.samples += 1

    def series(self, key: Key) -> list[list[float]]:
        """``[[unix_seconds, messages_per_second], ...]`` for ``key``, oldest first."""
        readings = list(self.readings.get(key, ()))
        points = []
        for (t0, c0), (t1, c1) in itertools.pairwise(readings):
            dt = t1 - t0
            points.append([round(t1, 3), round(max(0, c1 - c0) / dt, 3) if dt > 0 else 0.0])
        return points

    def rate_now(self, key: Key) -> float:
        points = self.series(key)
        return points[-1][1] if points else 0.0
