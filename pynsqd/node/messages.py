"""The control protocol between the supervisor and its shards, one frozen record per message (``frozen.py``).

Each message names its ``op`` once, here; ``encode`` turns it into what the control channel
carries (a JSON header and a raw payload, ``control.py``) and ``decode`` turns that back into
the message, so each side dispatches on the message's type through a table and never reads
a field by string. A message's ``bytes`` field (at most one: a connection's unread bytes, an
HTTP body, a stats document) travels as the payload, never through JSON. Descriptors
(``SCM_RIGHTS``: an accepted connection) travel beside the message, not in it.

Supervisor → shard: ``Adopt`` (a TCP connection, with its state and unread bytes),
``RunHTTP`` (an admin call proxied from another shard), ``CreateChannels``, ``Quiesce`` and
``Exit`` (the two shutdown phases), ``Drain`` and ``Release`` (the two phases of a shard's
replacement, ``supervisor/reload.py``), ``Hold`` and ``Resume`` (around an upgrade of the
supervisor).
Shard → supervisor: ``Ready``, ``Standby`` (a replacement waits for its shard's state),
``Snapshot`` (its topics, for ``nsqd.dat`` and lookupd), ``Updated`` (the topics a loop turn
changed), ``Changed`` (a topic or channel created or deleted), ``HandOff`` (a connection for
another shard), ``Proxy`` (an admin call for another shard's topic).
Both ways: ``StatsRequest``, ``HealthRequest``, ``SetConfig`` (``PUT /config`` node-wide),
``ServeHTTP`` (HTTP/HTTPS connections to serve; from a shard: to serve elsewhere),
``Handover`` (a replaced shard's state and connections, relayed to its replacement).
Replies: ``StatsDocument``, ``ShardDocuments``, ``Health``, ``HTTPResponse``, ``Failed``, ``Done``.
``Adopt`` and ``ServeHTTP`` are calls: the shard answers ``Done`` before it reads a byte of the
connections, and the supervisor keeps its copies of them until then (a shard that dies first
leaves them unread, for another process).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

from pynsqd.node.frozen import Frozen, frozen
from pynsqd.node.identify import Settings
from pynsqd.node.metadata import TopicRecord

M = TypeVar("M", bound="ControlMessage")
_REGISTRY: dict[str, type[ControlMessage]] = {}


class ControlMessage(Frozen):
    """A control message; subclasses are ``frozen`` records that set ``op`` and are
    registered by ``message``."""

    __slots__ = ()
    op: ClassVar[str] = ""
    payload_field: ClassVar[str | None] = None  # the field sent as the raw payload (typed ``bytes``)

    def encode(self) -> tuple[dict[str, Any], bytes]:
        """→ (JSON header, payload)."""
        header: dict[str, Any] = {"op": self.op}
        payload = b""
        for name in self._fields:
            if name == self.payload_field:
                payload = getattr(self, name)
            else:
                header[name] = getattr(self, name)
        return header, payload

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        kwargs = {k: v for k, v in fields.items() if k in cls._fields}
        if cls.payload_field is not None:
            kwargs[cls.payload_field] = payload
        return cls(**kwargs)


def message(cls: type[M]) -> type[M]:
    """Register ``cls`` (a ``frozen`` record) under its ``op`` (one class per op)."""
    assert cls.op and cls.op not in _REGISTRY, cls.op
    _REGISTRY[cls.op] = cls
    cls.payload_field = next((name for name in cls._fields if cls._types[name] == "bytes"), None)
    return cls


def decode_message(header: dict[str, Any], payload: bytes) -> ControlMessage:
    """A header and payload from the channel → the message. Raises ``ValueError``."""
    cls = _REGISTRY.get(header.get("op", ""))
    if cls is None:
        raise ValueError(f"unknown control message {header.get('op')!r}")
    try:
        return cls.from_wire(header, payload)
    except (TypeError, KeyError) as exc:
        raise ValueError(f"malformed control message {cls.op!r} - {exc}") from None


@dataclasses.dataclass(frozen=True)
class ConnectionState:
    """What a TCP connection brings to the shard it is handed to: what the supervisor's
    greeting read (``supervisor/handoff.py``), or what the relaying shard knew of it."""

    magic: bool = False  # the client's magic was read already
    remote: str = ""  # host:port of the client
    settings: Settings | None = None  # what its IDENTIFY negotiated
    pub_counts: dict[str, int] = dataclasses.field(default_factory=dict)  # a relayed connection's
    tls: dict[str, Any] | None = None  # TLS facts of a relayed connection (its TLS stays behind)
    compression: str = ""  # likewise, the compression it negotiated
    auth: dict[str, Any] | None = None  # its AUTH session (``AuthSession.export``)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ConnectionState:
        settings = value.get("settings")
        return cls(**{**value, "settings": Settings(**settings) if settings else None})


# --- supervisor → shard ------------------------------------------------------------------------
@message
@frozen
class Adopt(ControlMessage):
    """Serve this TCP connection (the descriptor), from where ``HandOff``/``greet`` left it."""

    op: ClassVar[str] = "adopt"
    state: ConnectionState
    unread: bytes = b""

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        return cls(state=ConnectionState.from_json(fields["state"]), unread=payload)


@message
@frozen
class ServeHTTP(ControlMessage):
    """Serve these HTTP (``tls``: HTTPS) connections (the descriptors); from a shard being
    replaced: idle ones, for the supervisor to hand to a shard that serves."""

    op: ClassVar[str] = "serve_http"
    tls: bool


@message
@frozen
class RunHTTP(ControlMessage):
    """Run this admin request here, the topic's owner; answered with ``HTTPResponse``."""

    op: ClassVar[str] = "http"
    method: str
    path: str
    query: str = ""
    scheme: str = "http"
    body: bytes = b""


@message
@frozen
class CreateChannels(ControlMessage):
    """A new topic's channels as lookupd knows them (nsqd's channel pre-creation)."""

    op: ClassVar[str] = "create_channels"
    topic: str
    channels: list[str]


@message
@frozen
class Quiesce(ControlMessage):
    """Shutdown phase 1: stop delivering, wait up to ``wait`` s for FIN/REQ, close clients;
    answered with ``Done``."""

    op: ClassVar[str] = "quiesce"
    wait: float


@message
@frozen
class Exit(ControlMessage):
    """Shutdown phase 2: drain the inbound rings, close the queues, send the last snapshot."""

    op: ClassVar[str] = "exit"


@message
@frozen
class Drain(ControlMessage):
    """Replacement phase 1 (``supervisor/reload.py``): hand idle HTTP connections back, let
    busy ones finish (up to ``wait`` s), sync the disk queues; TCP is served meanwhile.
    Answered with ``Done``."""

    op: ClassVar[str] = "drain"
    wait: float


@message
@frozen
class Release(ControlMessage):
    """Replacement phase 2: stop, send everything as ``Handover`` parts, answer ``Done``, exit."""

    op: ClassVar[str] = "release"


@message
@frozen
class Hold(ControlMessage):
    """Send nothing but replies until ``Resume`` (the supervisor is about to re-execute
    itself); answered with ``Done``."""

    op: ClassVar[str] = "hold"


@message
@frozen
class Resume(ControlMessage):
    """Send what ``Hold`` kept back, then a ``Snapshot``: a new supervisor image listens."""

    op: ClassVar[str] = "resume"


# --- shard → supervisor ------------------------------------------------------------------------
@message
@frozen
class Ready(ControlMessage):
    op: ClassVar[str] = "ready"
    version: str  # the pynsqd the shard runs (a reload or an upgrade changes it)


@message
@frozen
class Standby(ControlMessage):
    """A replacement shard booted and waits for its predecessor's ``Handover``."""

    op: ClassVar[str] = "standby"


@message
@frozen
class Snapshot(ControlMessage):
    """The shard's topics and channels with their paused flags (at its start, its exit, and
    when a new supervisor image asks)."""

    op: ClassVar[str] = "snapshot"
    topics: list[TopicRecord]

    def encode(self) -> tuple[dict[str, Any], bytes]:
        return {"op": self.op, "topics": [t.to_json() for t in self.topics]}, b""

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        topics = [TopicRecord.from_json(t) for t in fields["topics"]]
        return cls(topics=topics)


@message
@frozen
class Updated(ControlMessage):
    """Topics of the shard that changed (created, paused, a channel created, paused or deleted)
    as they now are, and the names of those deleted: a ``Snapshot`` of only what changed."""

    op: ClassVar[str] = "updated"
    topics: list[TopicRecord]
    deleted: list[str]

    def encode(self) -> tuple[dict[str, Any], bytes]:
        return {"op": self.op, "topics": [t.to_json() for t in self.topics], "deleted": self.deleted}, b""

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        topics = [TopicRecord.from_json(t) for t in fields["topics"]]
        return cls(topics=topics, deleted=[str(n) for n in fields["deleted"]])


@message
@frozen
class Changed(ControlMessage):
    """A topic (``channel`` None) or channel was ``created`` or ``deleted``."""

    op: ClassVar[str] = "changed"
    event: str
    topic: str
    channel: str | None = None


@message
@frozen
class HandOff(ControlMessage):
    """Give this connection (the descriptor) to ``shard`` as an ``Adopt``."""

    op: ClassVar[str] = "handoff"
    shard: int
    state: ConnectionState
    unread: bytes = b""

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        return cls(shard=fields["shard"], state=ConnectionState.from_json(fields["state"]),
                   unread=payload)


@message
@frozen
class Proxy(ControlMessage):
    """Run this admin request at ``shard``; answered with ``HTTPResponse`` or ``Failed``."""

    op: ClassVar[str] = "proxy"
    shard: int
    method: str
    path: str
    query: str = ""
    scheme: str = "http"
    body: bytes = b""

    def at_owner(self) -> RunHTTP:
        return RunHTTP(self.method, self.path, self.query, self.scheme, self.body)


# --- both ways ---------------------------------------------------------------------------------
@message
@frozen
class Handover(ControlMessage):
    """Part ``part`` of a replaced shard's state (``shard/transfer.py``: ``doc`` is its
    encoding; the descriptors are the connections it names); ``last`` ends it."""

    op: ClassVar[str] = "handover"
    part: int
    last: bool
    doc: bytes = b""


@message
@frozen
class StatsRequest(ControlMessage):
    """A stats document (``/stats``'s query); answered with ``StatsDocument``."""

    op: ClassVar[str] = "stats"
    topic: str = ""
    channel: str = ""
    include_clients: bool = True
    include_mem: bool = True
    include_shards: bool = False
    skip: int = -1  # a shard asking for the node's stats makes its own document itself


@message
@frozen
class HealthRequest(ControlMessage):
    """Answered with ``Health``: the shard's, or from the supervisor the node's."""

    op: ClassVar[str] = "health"


@message
@frozen
class SetConfig(ControlMessage):
    """``PUT /config/<opt>`` with ``value`` succeeded somewhere: apply it here too."""

    op: ClassVar[str] = "config"
    opt: str
    value: bytes = b""


# --- replies -----------------------------------------------------------------------------------
@message
@frozen
class StatsDocument(ControlMessage):
    op: ClassVar[str] = "stats_document"
    doc: bytes  # JSON


@message
@frozen
class ShardDocuments(ControlMessage):
    """The supervisor's answer to a shard's ``StatsRequest``: the other shards' documents as
    they sent them, joined without being parsed, for the asking shard to merge with its own:
    ``{"docs": [...], "supervisor": {...} or null, "start_time": n}``."""

    op: ClassVar[str] = "shard_documents"
    docs: bytes  # JSON


@message
@frozen
class Health(ControlMessage):
    op: ClassVar[str] = "health_status"
    health: str = "OK"


@message
@frozen
class HTTPResponse(ControlMessage):
    op: ClassVar[str] = "http_response"
    status: int
    headers: list[list[str]]
    body: bytes = b""


@message
@frozen
class Failed(ControlMessage):
    op: ClassVar[str] = "failed"
    error: str


@message
@frozen
class Done(ControlMessage):
    op: ClassVar[str] = "done"
