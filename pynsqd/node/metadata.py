"""``nsqd.dat``: the topics and channels of a node, and which are paused (NSQ's ``nsqd/nsqd.go``).

Same file and JSON as nsqd, so a data path moves between nsqd and pynsqd::

    {"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":false}]}],
     "version":"1.3.0"}

Ephemeral topics and channels are left out. The file is replaced atomically: written to
``nsqd.dat.<random>.tmp``, fsynced, renamed over the old one.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable
from typing import Any, NamedTuple

import orjson

from pynsqd import NSQ_VERSION
from pynsqd.wire.names import is_ephemeral, is_valid_name

FILENAME = "nsqd.dat"
log = logging.getLogger("pynsqd.shard")


class ChannelRecord(NamedTuple):
    """A channel as ``nsqd.dat`` keeps it."""

    name: str
    paused: bool


class TopicRecord(NamedTuple):
    """A topic as ``nsqd.dat`` keeps it: its paused flag and its channels."""

    name: str
    paused: bool
    channels: list[ChannelRecord]

    @classmethod
    def from_json(cls, value: Any) -> TopicRecord:
        """From its JSON form (``[name, paused, [[name, paused], ...]]``, as a shard's snapshot
        sends it)."""
        name, paused, channels = value
        return cls(str(name), bool(paused), [ChannelRecord(str(c), bool(p)) for c, p in channels])

    def to_json(self) -> list[Any]:
        return [self.name, self.paused, [[c.name, c.paused] for c in self.channels]]


def encode_topic(topic: TopicRecord) -> orjson.Fragment | None:
    """One topic's entry of the file, encoded once (``None`` for an ephemeral topic), so a
    node that changes one topic of thousands re-encodes only that one (``encode_pieces``)."""
    name, paused, channels = topic
    if is_ephemeral(name):
        return None
    return orjson.Fragment(orjson.dumps(
        {"name": name, "paused": paused,
         "channels": [{"name": c, "paused": p} for c, p in channels if not is_ephemeral(c)]}))


def encode_pieces(pieces: Iterable[orjson.Fragment]) -> bytes:
    """Topics encoded by ``encode_topic`` → the file's bytes."""
    return orjson.dumps({"topics": list(pieces), "version": NSQ_VERSION})


def encode(topics: list[TopicRecord]) -> bytes:
    """Topics → the file's bytes."""
    return encode_pieces(p for p in map(encode_topic, topics) if p is not None)


def decode(data: bytes) -> list[TopicRecord]:
    """The file's bytes → topics; invalid names are skipped with a warning, as nsqd does.

    Raises ``ValueError`` when the file is not nsqd metadata at all."""
    try:
        doc: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"failed to parse metadata - {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("topics", []), list):
        raise ValueError("failed to parse metadata - not an nsqd metadata document")
    topics = []
    for t in doc.get("topics") or []:
        name = t.get("name") if isinstance(t, dict) else None
        if not isinstance(name, str) or not is_valid_name(name):
            log.warning("skipping creation of invalid topic %r", name)
            continue
        channels = []
        for c in t.get("channels") or []:
            cname = c.get("name") if isinstance(c, dict) else None
            if not isinstance(cname, str) or not is_valid_name(cname):
                log.warning("skipping creation of invalid channel %r", cname)
                continue
            channels.append(ChannelRecord(cname, bool(c.get("paused"))))
        topics.append(TopicRecord(name, bool(t.get("paused")), channels))
    return topics


def load(data_dir: str) -> list[TopicRecord]:
    """Read ``nsqd.dat`` (none yet: no topics). Raises ``ValueError`` on a corrupt file."""
    path = os.path.join(data_dir, FILENAME)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return []
    return decode(data)


def save(data_dir: str, data: bytes) -> None:
    """Replace ``nsqd.dat`` atomically. Raises ``OSError``."""
    path = os.path.join(data_dir, FILENAME)
    tmp = f"{path}.{secrets.randbelow(1 << 31)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
