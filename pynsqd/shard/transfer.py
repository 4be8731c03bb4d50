"""A shard's state, moved from the process being replaced to the one replacing it.

Theory of operation
-------------------
A rolling restart (``supervisor/reload.py``) replaces each shard's process with a new one
running the installed code. The queues need no copying: their logs live in named
shared-memory segments and their overflow in disk-queue files, so the replacement attaches to
them as a restarted shard would (``MessageQueue.start_recovery``), once the old process has let go
of them (``MessageQueue.hand_over``: metadata written, files closed, segments left in
place). What lives only in the old process's memory is what this module moves:

- per topic and channel: the paused flags and counters; the queue's bookkeeping of its log
  (``MessageQueue.export``: ready and live counts, the delivery cursor, the records requeued
  behind it), which the replacement adopts instead of walking the log as after a crash, so
  every record keeps its state; what waits for a due time (deferred messages: id, log
  position, due time; the message itself only when it has no record in the log) and, for a
  topic, which channels already hold its waiting messages; each channel's consumers in their
  round-robin order, and what is in flight — per delivery the consumer, the delivery time,
  the deadline (``CLOCK_MONOTONIC`` nanoseconds: one clock for every process of the host)
  and the ids with their log positions, which the replacement holds in flight as they were
  (``Channel.hold_again``): nothing is redelivered and every timeout stays where it was;
- per plain TCP connection (``ClientV2.hand_over``): the descriptor (``SCM_RIGHTS``, through
  the supervisor), the negotiated settings, AUTH session and counters, the subscription and
  RDY, the message frames not yet written and the bytes read but not yet run. The client
  sees the same connection: nothing is closed, nothing is lost on either side.

A connection whose state cannot move — its own TLS or compression, whose cipher and codec
state live in this process; an upgrade or auth query under way; bytes still in the
transport's buffer — is closed cleanly (what is buffered is written, then a FIN), and what it
held in flight goes back to its queue at once (``Channel.remove_consumer``), as when any
consumer disconnects; the count is logged.

A queue still being recovered (the process restarted after a crash and walks its logs while
it serves, ``recovery.py``) has no exact bookkeeping yet: the old process finishes that walk
before it releases (``handover.drain``).

The state travels as ``Handover`` control messages, ``PART_FDS`` connections each (the
kernel's limit per message is 253): part 0 carries the topics, every part its clients. A
part's ``doc`` is ``[4B BE header length][JSON header][blobs]``; the header lists each
client's state, session and the lengths of its two blobs (output, unread input), which
follow in order. Message ids are 16 ASCII bytes, written as JSON strings.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from pynsqd.node.messages import ConnectionState
from pynsqd.node.metadata import ChannelRecord, TopicRecord
from pynsqd.shard.broker import Broker
from pynsqd.shard.protocol import ClientV2
from pynsqd.shard.topic import Topic

log = logging.getLogger("pynsqd.shard")

PART_FDS = 250  # connections per ``Handover`` part (SCM_MAX_FD is 253)
_HEAD = struct.Struct(">I")


@dataclasses.dataclass
class MovedClient:
    """One connection as ``ClientV2.hand_over`` gave it."""

    state: ConnectionState
    session: dict[str, Any]
    out: bytes
    unread: bytes


@dataclasses.dataclass
class Part:
    """One ``Handover`` part: the topics (part 0 only) and some connections."""

    topics: list[dict[str, Any]] | None
    clients: list[MovedClient]

    def encode(self) -> bytes:
        header = {"topics": self.topics,
                  "clients": [{"state": dataclasses.asdict(c.state), "session": c.session,
                               "out": len(c.out), "unread": len(c.unread)} for c in self.clients]}
        head = orjson.dumps(header)
        return b"".join([_HEAD.pack(len(head)), head, *(b for c in self.clients for b in (c.out, c.unread))])

    @classmethod
    def decode(cls, doc: bytes) -> Part:
        """Raises ``ValueError`` for a document that is not a part."""
        try:
            (n,) = _HEAD.unpack_from(doc)
            header = orjson.loads(doc[4:4 + n])
            at = 4 + n
            clients = []
            for c in header["clients"]:
                out = doc[at:at + c["out"]]
                at += c["out"]
                unread = doc[at:at + c["unread"]]
                at += c["unread"]
                clients.append(MovedClient(ConnectionState.from_json(c["state"]), c["session"], out, unread))
            return cls(header["topics"], clients)
        except (struct.error, orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"malformed handover part - {exc}") from None


@dataclasses.dataclass
class Captured:
    """What ``capture`` took from a shard: its parts with their descriptors."""

    parts: list[tuple[Part, list[int]]]
    moved: int
    closed: int  # connections that could not move
    requeued: int  # messages they held in flight, queued again

    def close_fds(self) -> None:
        for _, fds in self.parts:
            for fd in fds:
                os.close(fd)


def capture(broker: Broker) -> Captured:
    """Take everything from ``broker`` (frozen: nothing pumps, no connection reads) that a
    replacement needs, in ``Handover`` parts; close the connections that cannot move."""
    clients: list[ClientV2] = [c for c in broker.clients if isinstance(c, ClientV2)]
    movable = [c for c in clients if c.movable]
    index = {id(c): i for i, c in enumerate(movable)}
    now = time.monotonic_ns()
    closed = requeued = 0
    for client in clients:
        if id(client) in index:
            continue
        channel = client.session.channel
        if channel is not None:
            requeued += client.in_flight_count
            channel.remove_consumer(client, now)
            client.session.channel = None
            broker.consumer_left(channel)
        client.close()
        closed += 1
    topics = [_topic_state(topic, index) for topic in broker.topics.values()]
    moved: list[MovedClient] = []
    fds: list[int] = []
    for client in movable:
        fd, state, session, out, unread = client.hand_over()
        moved.append(MovedClient(state, session, out, unread))
        fds.append(fd)
    parts = []
    for start in range(0, max(len(moved), 1), PART_FDS):
        parts.append((Part(topics if start == 0 else None, moved[start:start + PART_FDS]),
                      fds[start:start + PART_FDS]))
    return Captured(parts, len(moved), closed, requeued)


def _topic_state(topic: Topic, index: dict[int, int]) -> dict[str, Any]:
    channels = []
    for channel in topic.channels.values():
        deliveries = [[index[id(client)], delivered, deadline, [i.decode("latin-1") for i in ids], positions]
                      for client, delivered, deadline, ids, positions in channel.deliveries()
                      if id(client) in index]
        deferred = [[msg_id.decode("latin-1"), pos, due, None if pos >= 0 else _b64(record)]
                    for msg_id, pos, due, record in channel.deferred_entries()]
        channels.append({"name": channel.name, "paused": channel.paused, "message_count": channel.message_count,
                         "requeue_count": channel.requeue_count, "timeout_count": channel.timeout_count,
                         "queue": channel.queue.export(), "deferred": deferred,
                         "consumers": [index[id(c)] for c in channel.consumers if id(c) in index],
                         "deliveries": deliveries})
    waiting = [[pos, due, None if pos >= 0 else _b64(record)] for record, due, pos in topic.waiting_deferred]
    return {"name": topic.name, "paused": topic.paused, "message_count": topic.message_count,
            "message_bytes": topic.message_bytes, "queue": topic.queue.export(), "waiting_deferred": waiting,
            "handed": {msg_id.decode("latin-1"): sorted(names) for msg_id, names in topic.handed.items()},
            "channels": channels}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def records(topics: list[dict[str, Any]]) -> list[TopicRecord]:
    """The topics of part 0 as ``nsqd.dat`` records (``Broker.restore`` makes them)."""
    return [TopicRecord(t["name"], t["paused"], [ChannelRecord(c["name"], c["paused"]) for c in t["channels"]])
            for t in topics]


class Restorer:
    """The replacement's side: the parts in, the broker and the connections as they were."""

    def __init__(self, broker: Broker, make_client: Callable[[ConnectionState, bytes], ClientV2]) -> None:
        self.broker = broker
        self.make_client = make_client  # (state, unread) -> a ClientV2 not yet connected
        self.topics: list[dict[str, Any]] = []
        self.moved: list[MovedClient] = []
        self.fds: list[int | None] = []  # per moved connection; None: its descriptor was lost
        self.clients: list[ClientV2] = []
        self.held = 0

    def add(self, part: Part, fds: list[int]) -> None:
        if part.topics is not None:
            self.topics = part.topics
        self.moved += part.clients
        got = fds[:len(part.clients)]
        for extra in fds[len(part.clients):]:
            os.close(extra)
        # Descriptors lost on the way (a process out of them: the kernel passes the first
        # ones and drops the rest) leave their connections without a socket: each stays
        # paired with its own state and is given up in ``connect``.
        self.fds += [*got, *[None] * (len(part.clients) - len(got))]

    def restore_queues(self) -> None:
        """Topics and channels as the replaced process left them: each queue attaches to its
        segment and takes the replaced process's bookkeeping of it (``MessageQueue.adopt``:
        nothing is walked, nothing in flight becomes ready), then the counters, what waits
        for a due time and what was in flight."""
        broker = self.broker
        for t in self.topics:
            broker.adopted[("topic", t["name"])] = t["queue"]
            for c in t["channels"]:
                broker.adopted[("channel", f"{t['name']}:{c['name']}")] = c["queue"]
        broker.restore(records(self.topics))
        broker.adopted.clear()
        self.clients = []
        for moved in self.moved:
            client = self.make_client(moved.state, moved.unread)
            client.restore_session(moved.state, moved.session, moved.out)
            self.clients.append(client)
        for t in self.topics:
            topic = broker.topics.get(t["name"])
            if topic is None:
                continue
            topic.message_count, topic.message_bytes = t["message_count"], t["message_bytes"]
            for pos, due, record in t["waiting_deferred"]:
                raw = _unb64(record)
                topic.waiting_deferred.append((raw if raw is not None else topic.queue.message_at(pos), due, pos))
            topic.handed = {msg_id.encode("latin-1"): set(names) for msg_id, names in t["handed"].items()}
            broker.schedule(topic)
            for c in t["channels"]:
                channel = topic.channels.get(c["name"])
                if channel is None:
                    continue
                channel.message_count = c["message_count"]
                channel.requeue_count = c["requeue_count"]
                channel.timeout_count = c["timeout_count"]
                channel.adopt_deferred([(msg_id.encode("latin-1"), pos, due, _unb64(record))
                                        for msg_id, pos, due, record in c["deferred"]])
                for i in c["consumers"]:
                    client = self.clients[i]
                    client.session.channel = channel
                    channel.consumers.append(client)
                for i, delivered, deadline, ids, positions in c["deliveries"]:
                    self.held += channel.hold_again(self.clients[i], [x.encode("latin-1") for x in ids], positions,
                                                    delivered, deadline)

    async def connect(self) -> int:
        """Serve every moved connection here; how many could not be (their messages go back
        to their queues, as for any consumer that leaves)."""
        loop = asyncio.get_running_loop()
        failed = 0
        for client, fd in zip(self.clients, self.fds, strict=True):
            if fd is None:
                client.connection_lost(ConnectionError("its descriptor was lost on the way (out of descriptors?)"))
                failed += 1
                continue
            sock = socket.socket(fileno=fd)
            try:
                await loop.connect_accepted_socket(_factory(client), sock)
            except OSError as exc:
                log.warning("a moved connection could not be served - %s", exc)
                sock.close()
                client.connection_lost(exc)
                failed += 1
        channels = (c.session.channel for c in self.clients)
        for channel in {id(ch): ch for ch in channels if ch is not None}.values():
            channel.notify_ready()
            if channel.consumers:
                self.broker.schedule(channel)
        return failed


def _factory(client: ClientV2) -> Callable[[], ClientV2]:
    return lambda: client


def parts(captured: Captured) -> Iterator[tuple[int, bool, bytes, list[int]]]:
    """(part number, last, encoded doc, descriptors) of each part."""
    for i, (part, fds) in enumerate(captured.parts):
        yield i, i == len(captured.parts) - 1, part.encode(), fds
