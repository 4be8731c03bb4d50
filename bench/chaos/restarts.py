"""What a reload or an upgrade (``faults.RESTARTS``) must not do to clients, and how long they
made publishers wait: judged from the ledger's faults, the consumers' connections and the
producers' errors and latencies.

- **disconnected**: a consumer connection (not on a topic in ``ignore``: those of consumers
  whose TLS or compression cannot move) that ended while a restart ran, or within ``SLACK``
  seconds after;
- **publish errors**: a producer error in those windows (a refused or failed connection, an
  error answer, no answer);
- **stall**: the time from sending a publish to its acknowledgement, for publishes sent in
  those windows, outside them (the same run's baseline) and for all, as percentiles and the
  longest, per protocol.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from bench.chaos.ledger import Ledger
from bench.chaos.load import HttpProducer, Producer

SLACK = 1.0  # seconds after a restart that an ending connection is still blamed on it


def windows(ledger: Ledger, kinds: Iterable[str]) -> list[tuple[float, float]]:
    wanted = set(kinds)
    return [(began, ended + SLACK) for began, ended, kind in ledger.faults if kind in wanted]


def _inside(at: float, spans: Sequence[tuple[float, float]]) -> bool:
    return any(start <= at <= end for start, end in spans)


def disconnected(ledger: Ledger, spans: Sequence[tuple[float, float]], ignore: frozenset[str] = frozenset()) -> int:
    return sum(1 for c in ledger.connections
               if c.closed is not None and c.topic not in ignore and _inside(c.closed, spans))


def publish_errors(producers: Iterable[Producer], spans: Sequence[tuple[float, float]]) -> int:
    return sum(1 for p in producers for at in p.errors_at if _inside(at, spans))


def _figures(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"publishes": 0}
    values = sorted(values)
    ms = [v * 1000 for v in values]
    return {"publishes": len(ms), "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1), "max_ms": round(ms[-1], 1)}


def stalls(producers: Iterable[Producer], spans: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """Publish-to-acknowledgement times, in the restart windows and overall, per protocol."""
    out: dict[str, Any] = {}
    producers = list(producers)
    for proto in ("tcp", "http"):
        mine = [p for p in producers if isinstance(p, HttpProducer) == (proto == "http")]
        lat = [(sent, took) for p in mine for sent, took in p.latencies]
        out[proto] = {"during_restarts": _figures([t for s, t in lat if _inside(s, spans)]),
                      "outside_restarts": _figures([t for s, t in lat if not _inside(s, spans)]),
                      "all": _figures([t for _, t in lat])}
    lat = [(sent, took) for p in producers for sent, took in p.latencies]
    out["all_protocols_during_restarts"] = _figures([t for s, t in lat if _inside(s, spans)])
    out["all_protocols_outside_restarts"] = _figures([t for s, t in lat if not _inside(s, spans)])
    out["longest"] = [{"ms": round(took * 1000, 1), "after_start_s": round(sent - start, 2), "restart": n}
                      for sent, took in sorted(lat, key=lambda x: -x[1])[:5]
                      for n, (start, end) in enumerate(spans) if start <= sent <= end]
    return out
