"""The supervisor as the hub of its shards: what one shard asks of the others goes through it.

Theory of operation
-------------------
Shards do not talk to each other over control channels; the supervisor relays. ``Hub`` holds
those relays, each one call per shard over the shards' control channels:

- ``/stats`` (``stats``): the other shards' documents, passed on unparsed with their indices,
  for the asking shard to merge with its own; ``node_stats`` merges them here (statsd);
- ``/ping`` (``health``): the first shard that is not OK decides the node's health;
- an admin call for a topic another shard owns (``proxy``): run at the owner, answered
  with its ``HTTPResponse`` or ``Failed`` (the asking shard's ``500 INTERNAL_ERROR``);
- a message for one shard (``send_to``: ``PUT /config`` node-wide, channel pre-creation).

A shard still booting for the first time is waited for, so ``/stats`` and ``/ping`` speak
for every shard from the first ready one on; so is a shard being replaced (``Slot.swapping``:
its calls go to the replacement once it is ready, ``reload.py``). An owner known to be down
(dead, or booting again after a death) fails a proxied call at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import orjson

from pynsqd.node.aggregate import merge_stats
from pynsqd.node.control import CALL_WAIT, PROXY_WAIT, Received
from pynsqd.node.messages import (
    ControlMessage,
    Failed,
    Health,
    HealthRequest,
    HTTPResponse,
    Proxy,
    ShardDocuments,
    StatsDocument,
    StatsRequest,
)
from pynsqd.supervisor.slots import Slot

READY_TIMEOUT = 30.0  # seconds a call waits for a shard booting for the first time


class Hub:
    """Calls on behalf of shards, over ``slots``; ``describe`` gives the supervisor's own
    figures (``/stats?include_shards``), ``start_time`` the node's."""

    def __init__(self, slots: list[Slot], describe: Callable[[], dict[str, Any]], start_time: int) -> None:
        self.slots = slots
        self.describe = describe
        self.start_time = start_time

    async def call_each(self, msg: ControlMessage, skip: int = -1) -> list[tuple[int, ControlMessage]]:
        """``msg`` to every ready shard but ``skip`` (one being replaced: to its replacement,
        once ready): (shard index, reply) of those that answered. A shard still booting for
        the first time is waited for."""
        booting = [asyncio.ensure_future(s.ready.wait()) for s in self.slots if s.index != skip and s.first_boot]
        if booting:
            _, late = await asyncio.wait(booting, timeout=READY_TIMEOUT)
            for wait in late:
                wait.cancel()
        slots = [s for s in self.slots if s.index != skip and (s.is_ready or s.swapping)]
        replies = await asyncio.gather(*(self._call(s, msg) for s in slots), return_exceptions=True)
        return [(s.index, r) for s, r in zip(slots, replies) if isinstance(r, ControlMessage)]

    async def _call(self, slot: Slot, msg: ControlMessage) -> ControlMessage:
        if slot.swapping:
            await asyncio.wait_for(slot.ready.wait(), CALL_WAIT)
        if slot.channel is None or slot.channel.closed:
            raise ConnectionError(f"shard {slot.index} is down")
        return await slot.channel.call(msg, wait=CALL_WAIT)

    async def send_to(self, slot: Slot, msg: ControlMessage) -> None:
        """``msg`` to ``slot``'s shard (one being replaced: to its replacement, once ready)."""
        if slot.swapping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.ready.wait(), CALL_WAIT)
        if slot.channel is not None and not slot.channel.closed:
            slot.channel.send(msg)

    async def stats(self, slot: Slot, msg: StatsRequest, received: Received) -> None:
        """A shard's ``/stats``: the other shards' documents, passed on unparsed with their
        indices; the asking shard makes its own meanwhile and merges them all."""
        replies = await self.call_each(msg, skip=msg.skip)
        docs = b",".join(b"[%d,%s]" % (i, r.doc) for i, r in replies if isinstance(r, StatsDocument))
        supervisor = orjson.dumps(self.describe() if msg.include_shards else None)
        if slot.channel is not None:
            slot.channel.reply(received, ShardDocuments(
                b'{"docs":[%s],"supervisor":%s,"start_time":%d}' % (docs, supervisor, self.start_time)))

    async def health(self, slot: Slot, received: Received) -> None:
        """``/ping`` is the node's health: the first shard that is not OK decides it."""
        replies = [r for _, r in await self.call_each(HealthRequest()) if isinstance(r, Health)]
        bad = [r.health for r in replies if r.health != "OK"]
        if slot.channel is not None:
            slot.channel.reply(received, Health(bad[0] if bad else "OK"))

    async def node_stats(self, request: StatsRequest) -> dict[str, Any]:
        """The node's stats document: every ready shard's, merged (``aggregate.py``); the
        supervisor's own figures only with ``include_shards``."""
        docs = [orjson.loads(r.doc) for _, r in await self.call_each(request) if isinstance(r, StatsDocument)]
        doc = merge_stats(docs, self.describe() if request.include_shards else None, request.topic)
        doc["start_time"] = self.start_time
        return doc

    async def proxy(self, origin: Slot, msg: Proxy, received: Received) -> None:
        """An admin call for a topic another shard owns, run at the owner. An owner known to be
        down (dead, or booting again after a death) is answered at once with an error; one
        that is booting for the first time, being replaced or does not answer gets
        ``PROXY_WAIT`` seconds. The asking shard turns an error into nsqd's ``500
        INTERNAL_ERROR``."""
        answer = await self._run_at_owner(msg)
        if origin.channel is not None:
            origin.channel.reply(received, answer)

    async def _run_at_owner(self, msg: Proxy) -> HTTPResponse | Failed:
        slot = self.slots[msg.shard]
        deadline = time.monotonic() + PROXY_WAIT
        if not slot.swapping and (slot.pid == 0 or (slot.restarts and not slot.is_ready)
                                  or (slot.channel is not None and slot.channel.closed)):
            return Failed(f"shard {slot.index} is down")
        try:
            await asyncio.wait_for(slot.ready.wait(), PROXY_WAIT)
            if slot.channel is None or slot.channel.closed:
                raise ConnectionError("closed")
            reply = await slot.channel.call(msg.at_owner(), wait=max(0.1, deadline - time.monotonic()))
        except ConnectionError:
            return Failed(f"shard {slot.index} is down")
        except TimeoutError:
            return Failed(f"shard {slot.index} did not answer in {PROXY_WAIT:g}s")
        if not isinstance(reply, HTTPResponse):
            return Failed(f"shard {slot.index} answered {reply.op}")
        return reply
