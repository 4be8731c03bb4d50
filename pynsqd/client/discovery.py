"""Finding the nsqd that carry a topic by polling nsqlookupd's ``/lookup``.

Theory of operation (NSQ's client guide, "Discovery"). Every poll asks all configured lookupd
concurrently; the producers they list are unioned, keyed by ``broadcast_address:tcp_port``.
A consumer connects to new keys at once. A key is *gone* only when every lookupd answered
(a 404 ``TOPIC_NOT_FOUND`` counts as an answer with no producers) and none listed it — a
lookupd that could not be reached says nothing about which nodes left. Polls repeat every
``interval`` shortened by a random fraction up to ``jitter``, so many consumers started at
the same moment do not query in step.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from pynsqd.client import http as nsq_http
from pynsqd.client.errors import NSQError

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("pynsqd.client")


def poll_delay(interval: float, jitter: float, rng: random.Random) -> float:
    """Seconds until the next poll: in ``[interval * (1 - jitter), interval]``."""
    return interval * (1.0 - jitter * rng.random())


def producer_keys(data: Any) -> set[str]:
    """``broadcast_address:tcp_port`` of the producers in a ``/lookup`` answer (v1 shape, or
    the pre-1.0 ``{"data": {...}}`` envelope)."""
    if isinstance(data, dict) and "producers" not in data and isinstance(data.get("data"), dict):
        data = data["data"]
    keys: set[str] = set()
    if not isinstance(data, dict):
        return keys
    for producer in data.get("producers") or []:
        if not isinstance(producer, dict):
            continue
        host, port = producer.get("broadcast_address"), producer.get("tcp_port")
        if isinstance(host, str) and host and isinstance(port, int) and port > 0:
            keys.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return keys


@dataclass
class LookupResult:
    """One poll: the union of producers, and whether every lookupd answered."""

    producers: set[str] = field(default_factory=set)
    complete: bool = True


async def lookup(client: httpx.AsyncClient, lookupds: list[str], topic: str) -> LookupResult:
    """Ask every lookupd for ``topic``'s producers; failures are logged, not raised."""
    async def one(address: str) -> set[str] | None:
        url = f"{nsq_http.base_url(address)}/lookup"
        try:
            resp = await nsq_http.request(client, "GET", url, params={"topic": topic}, ok_statuses=(404,))
        except NSQError as exc:
            log.warning("lookupd %s: %s", address, exc)
            return None
        if resp.status_code == 404:
            return set()
        try:
            return producer_keys(orjson.loads(resp.content))
        except orjson.JSONDecodeError:
            log.warning("lookupd %s: answer is not JSON", address)
            return None

    answers = await asyncio.gather(*(one(a) for a in lookupds))
    result = LookupResult()
    for answer in answers:
        if answer is None:
            result.complete = False
        else:
            result.producers |= answer
    return result
