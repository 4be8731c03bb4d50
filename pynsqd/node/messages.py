"""The control protocol between the supervisor and its shards, one dataclass per message.

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

from pynsqd.node.identify import Settings
from pynsqd.node.metadata import TopicRecord

M = TypeVar("M", bound="Message")
_REGISTRY: dict[str, type[Message]] = {}


@dataclasses.dataclass(frozen=True)
class Message:
    """A control message; subclasses set ``op`` and are registered by ``message``."""

    op: ClassVar[str] = ""

    def encode(self) -> tuple[dict[str, Any], bytes]:
        """→ (JSON header, payload)."""
        header: dict[str, Any] = {"op": self.op}
        payload = b""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bytes):
                payload = value
            else:
                header[f.name] = value
        return header, payload

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        names = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in fields.items() if k in names}
        for name, f in names.items():
            if f.type == "bytes":
                kwargs[name] = payload
        return cls(**kwargs)


def message(cls: type[M]) -> type[M]:
    """Register ``cls`` under its ``op`` (one class per op)."""
    assert cls.op and cls.op not in _REGISTRY, cls.op
    _REGISTRY[cls.op] = cls
    return cls


def decode_message(header: dict[str, Any], payload: bytes) -> Message:
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
@dataclasses.dataclass(frozen=True)
class Adopt(Message):
    """Serve this TCP connection (the descriptor), from where ``HandOff``/``greet`` left it."""

    op: ClassVar[str] = "adopt"
    state: ConnectionState
    unread: bytes = b""

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        return cls(state=ConnectionState.from_json(fields["state"]), unread=payload)  # type: ignore[call-arg]


@message
@dataclasses.dataclass(frozen=True)
class ServeHTTP(Message):
    """Serve these HTTP (``tls``: HTTPS) connections (the descriptors); from a shard being
    replaced: idle ones, for the supervisor to hand to a shard that serves."""

    op: ClassVar[str] = "serve_http"
    tls: bool


@message
@dataclasses.dataclass(frozen=True)
class RunHTTP(Message):
    """Run this admin request here, the topic's owner; answered with ``HTTPResponse``."""

    op: ClassVar[str] = "http"
    method: str
    path: str
    query: str = ""
    scheme: str = "http"
    body: bytes = b""


@message
@dataclasses.dataclass(frozen=True)
class CreateChannels(Message):
    """A new topic's channels as lookupd knows them (nsqd's channel pre-creation)."""

    op: ClassVar[str] = "create_channels"
    topic: str
    channels: list[str]


@message
@dataclasses.dataclass(frozen=True)
class Quiesce(Message):
    """Shutdown phase 1: stop delivering, wait up to ``wait`` s for FIN/REQ, close clients;
    answered with ``Done``."""

    op: ClassVar[str] = "quiesce"
    wait: float


@message
@dataclasses.dataclass(frozen=True)
class Exit(Message):
    """Shutdown phase 2: drain the inbound rings, close the queues, send the last snapshot."""

    op: ClassVar[str] = "exit"


@message
@dataclasses.dataclass(frozen=True)
class Drain(Message):
    """Replacement phase 1 (``supervisor/reload.py``): hand idle HTTP connections back, let
    busy ones finish (up to ``wait`` s), sync the disk queues; TCP is served meanwhile.
    Answered with ``Done``."""

    op: ClassVar[str] = "drain"
    wait: float


@message
@dataclasses.dataclass(frozen=True)
class Release(Message):
    """Replacement phase 2: stop, send everything as ``Handover`` parts, answer ``Done``, exit."""

    op: ClassVar[str] = "release"


@message
@dataclasses.dataclass(frozen=True)
class Hold(Message):
    """Send nothing but replies until ``Resume`` (the supervisor is about to re-execute
    itself); answered with ``Done``."""

    op: ClassVar[str] = "hold"


@message
@dataclasses.dataclass(frozen=True)
class Resume(Message):
    """Send what ``Hold`` kept back, then a ``Snapshot``: a new supervisor image listens."""

    op: ClassVar[str] = "resume"


# --- shard → supervisor ------------------------------------------------------------------------
@message
@dataclasses.dataclass(frozen=True)
class Ready(Message):
    op: ClassVar[str] = "ready"
    version: str  # the pynsqd the shard runs (a reload or an upgrade changes it)


@message
@dataclasses.dataclass(frozen=True)
class Standby(Message):
    """A replacement shard booted and waits for its predecessor's ``Handover``."""

    op: ClassVar[str] = "standby"


@message
@dataclasses.dataclass(frozen=True)
class Snapshot(Message):
    """The shard's topics and channels with their paused flags (at its start, its exit, and
    when a new supervisor image asks)."""

    op: ClassVar[str] = "snapshot"
    topics: list[TopicRecord]

    def encode(self) -> tuple[dict[str, Any], bytes]:
        return {"op": self.op, "topics": [t.to_json() for t in self.topics]}, b""

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        topics = [TopicRecord.from_json(t) for t in fields["topics"]]
        return cls(topics=topics)  # type: ignore[call-arg]


@message
@dataclasses.dataclass(frozen=True)
class Updated(Message):
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
        return cls(topics=topics, deleted=[str(n) for n in fields["deleted"]])  # type: ignore[call-arg]


@message
@dataclasses.dataclass(frozen=True)
class Changed(Message):
    """A topic (``channel`` None) or channel was ``created`` or ``deleted``."""

    op: ClassVar[str] = "changed"
    event: str
    topic: str
    channel: str | None = None


@message
@dataclasses.dataclass(frozen=True)
class HandOff(Message):
    """Give this connection (the descriptor) to ``shard`` as an ``Adopt``."""

    op: ClassVar[str] = "handoff"
    shard: int
    state: ConnectionState
    unread: bytes = b""

    @classmethod
    def from_wire(cls: type[M], fields: dict[str, Any], payload: bytes) -> M:
        return cls(shard=fields["shard"], state=ConnectionState.from_json(fields["state"]),  # type: ignore[call-arg]
                   unread=payload)


@message
@dataclasses.dataclass(frozen=True)
class Proxy(Message):
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
@dataclasses.dataclass(frozen=True)
class Handover(Message):
    """Part ``part`` of a replaced shard's state (``shard/transfer.py``: ``doc`` is its
    encoding; the descriptors are the connections it names); ``last`` ends it."""

    op: ClassVar[str] = "handover"
    part: int
    last: bool
    doc: bytes = b""


@message
@dataclasses.dataclass(frozen=True)
class StatsRequest(Message):
    """A stats document (``/stats``'s query); answered with ``StatsDocument``."""

    op: ClassVar[str] = "stats"
    topic: str = ""
    channel: str = ""
    include_clients: bool = True
    include_mem: bool = True
    include_shards: bool = False
    skip: int = -1  # a shard asking for the node's stats makes its own document itself


@message
@dataclasses.dataclass(frozen=True)
class HealthRequest(Message):
    """Answered with ``Health``: the shard's, or from the supervisor the node's."""

    op: ClassVar[str] = "health"


@message
@dataclasses.dataclass(frozen=True)
class SetConfig(Message):
    """``PUT /config/<opt>`` with ``value`` succeeded somewhere: apply it here too."""

    op: ClassVar[str] = "config"
    opt: str
    value: bytes = b""


# --- replies -----------------------------------------------------------------------------------
@message
@dataclasses.dataclass(frozen=True)
class StatsDocument(Message):
    op: ClassVar[str] = "stats_document"
    doc: bytes  # JSON


@message
@dataclasses.dataclass(frozen=True)
class ShardDocuments(Message):
    """The supervisor's answer to a shard's ``StatsRequest``: the other shards' documents as
    they sent them, joined without being parsed, for the asking shard to merge with its own:
    ``{"docs": [...], "supervisor": {...} or null, "start_time": n}``."""

    op: ClassVar[str] = "shard_documents"
    docs: bytes  # JSON


@message
@dataclasses.dataclass(frozen=True)
class Health(Message):
    op: ClassVar[str] = "health_status"
    health: str = "OK"


@message
@dataclasses.dataclass(frozen=True)
class HTTPResponse(Message):
    op: ClassVar[str] = "http_response"
    status: int
    headers: list[list[str]]
    body: bytes = b""


@message
@dataclasses.dataclass(frozen=True)
class Failed(Message):
    op: ClassVar[str] = "failed"
    error: str


@message
@dataclasses.dataclass(frozen=True)
class Done(Message):
    op: ClassVar[str] = "done"
