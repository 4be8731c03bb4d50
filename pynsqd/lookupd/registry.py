"""The registration DB: which producers (nsqd nodes) hold which topics and channels.

Theory of operation
-------------------
Pure state, no I/O and no clock: every time is passed in as integer nanoseconds since
the Unix epoch (what ``/debug`` reports), so tests drive time by hand.

A ``Registration`` is ``(category, key, subkey)``: ``("client", "", "")`` lists every
identified producer, ``("topic", t, "")`` the producers of a topic, ``("channel", t, c)``
those of a channel. Each maps to the producers registered under it, by producer id (the
connection's remote address). A registration may have no producers: it is created over
HTTP, or its producers left; only ``remove_registration`` deletes it.

One connection has one ``PeerInfo`` (its IDENTIFY data and ``last_update``, refreshed by
PING) but a separate ``Producer`` per registration, because a tombstone belongs to one
registration: tombstoning a node for topic A must not hide it under topic B (NSQ #148).

A ``*`` in a lookup's key or subkey matches anything. Two indexes keep the common paths
off a full scan: ``(category, key)`` → its subkeys (a topic's channels), and producer id →
its registrations (what a disconnect removes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import NamedTuple

WILDCARD = "*"
# Go's zero time.Time reports this from UnixNano(): what /debug shows for "never tombstoned".
GO_ZERO_TIME_NS = ((-62135596800 * 10**9 + 2**63) % 2**64) - 2**63


class Registration(NamedTuple):
    category: str
    key: str
    subkey: str

    def matches(self, category: str, key: str, subkey: str) -> bool:
        """True when this registration is found by a lookup that may hold ``*``."""
        return (self.category == category
                and (key == WILDCARD or self.key == key)
                and (subkey == WILDCARD or self.subkey == subkey))


CLIENT = Registration("client", "", "")


def topic_key(topic: str) -> Registration:
    return Registration("topic", topic, "")


def channel_key(topic: str, channel: str) -> Registration:
    return Registration("channel", topic, channel)


@dataclasses.dataclass(eq=False, slots=True)
class PeerInfo:
    """One identified producer connection; shared by all its ``Producer`` entries."""

    id: str
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    last_update: int  # ns; IDENTIFY and every PING set it

    def public(self) -> dict[str, object]:
        """The PeerInfo JSON object of ``/lookup`` (field order as NSQ's struct)."""
        return {
            "remote_address": self.remote_address, "hostname": self.hostname,
            "broadcast_address": self.broadcast_address, "tcp_port": self.tcp_port,
            "http_port": self.http_port, "version": self.version,
        }


@dataclasses.dataclass(eq=False, slots=True)
class Producer:
    """A peer as listed under one registration, with that registration's tombstone."""

    peer: PeerInfo
    tombstoned: bool = False
    tombstoned_at: int = GO_ZERO_TIME_NS

    def tombstone(self, now: int) -> None:
        self.tombstoned = True
        self.tombstoned_at = now

    def is_tombstoned(self, lifetime: int, now: int) -> bool:
        """Tombstones expire: after ``lifetime`` ns the producer is listed again."""
        return self.tombstoned and now - self.tombstoned_at < lifetime

    @property
    def id(self) -> str:
        return self.peer.id


def filter_by_active(producers: Iterable[Producer], now: int, inactivity_timeout: int,
                     tombstone_lifetime: int) -> list[Producer]:
    """Producers that PINGed within ``inactivity_timeout`` and are not tombstoned (a
    ``tombstone_lifetime`` of 0 keeps tombstoned ones)."""
    return [p for p in producers
            if now - p.peer.last_update <= inactivity_timeout
            and not p.is_tombstoned(tombstone_lifetime, now)]


class RegistrationDB:
    """Registrations and their producers. Insertion order is kept, so listings are stable."""

    def __init__(self) -> None:
        self._map: dict[Registration, dict[str, Producer]] = {}
        self._subkeys: dict[tuple[str, str], dict[str, None]] = {}
        self._by_peer: dict[str, dict[Registration, None]] = {}

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: Registration) -> bool:
        return key in self._map

    def items(self) -> Iterator[tuple[Registration, list[Producer]]]:
        """Every registration with its producers (for ``/debug``)."""
        for key, producers in self._map.items():
            yield key, list(producers.values())

    # --- changes --------------------------------------------------------------------------

    def add_registration(self, key: Registration) -> None:
        """Make sure ``key`` exists (with no producers if it is new)."""
        if key not in self._map:
            self._map[key] = {}
            self._subkeys.setdefault((key.category, key.key), {})[key.subkey] = None

    def add_producer(self, key: Registration, producer: Producer) -> bool:
        """Register ``producer`` under ``key``; False when that id was already there."""
        self.add_registration(key)
        producers = self._map[key]
        if producer.id in producers:
            return False
        producers[producer.id] = producer
        self._by_peer.setdefault(producer.id, {})[key] = None
        return True

    def remove_producer(self, key: Registration, producer_id: str) -> tuple[bool, int]:
        """Remove a producer from ``key``; returns (was it there, producers left). The
        registration stays, even empty."""
        producers = self._map.get(key)
        if producers is None:
            return False, 0
        removed = producers.pop(producer_id, None) is not None
        if removed:
            self._unindex_peer(producer_id, key)
        return removed, len(producers)

    def remove_registration(self, key: Registration) -> None:
        """Delete ``key`` and every producer under it."""
        producers = self._map.pop(key, None)
        if producers is None:
            return
        for producer_id in producers:
            self._unindex_peer(producer_id, key)
        group = (key.category, key.key)
        subkeys = self._subkeys[group]
        del subkeys[key.subkey]
        if not subkeys:
            del self._subkeys[group]

    def _unindex_peer(self, producer_id: str, key: Registration) -> None:
        keys = self._by_peer[producer_id]
        del keys[key]
        if not keys:
            del self._by_peer[producer_id]

    # --- lookups --------------------------------------------------------------------------

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        """Registrations matching the lookup; ``key`` and ``subkey`` may be ``*``."""
        if key != WILDCARD:
            subkeys = self._subkeys.get((category, key), {})
            if subkey != WILDCARD:
                return [Registration(category, key, subkey)] if subkey in subkeys else []
            return [Registration(category, key, s) for s in subkeys]
        return [k for k in self._map if k.matches(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers under the matching registrations, each peer once (the first found)."""
        if key != WILDCARD and subkey != WILDCARD:
            return list(self._map.get(Registration(category, key, subkey), {}).values())
        seen: dict[str, Producer] = {}
        for reg in self.find_registrations(category, key, subkey):
            for producer_id, producer in self._map[reg].items():
                seen.setdefault(producer_id, producer)
        return list(seen.values())

    def lookup_registrations(self, producer_id: str) -> list[Registration]:
        """Every registration this producer is listed under."""
        return list(self._by_peer.get(producer_id, {}))

    def producer(self, key: Registration, producer_id: str) -> Producer | None:
        return self._map.get(key, {}).get(producer_id)


def keys(registrations: Iterable[Registration]) -> list[str]:
    return [r.key for r in registrations]


def subkeys(registrations: Iterable[Registration]) -> list[str]:
    return [r.subkey for r in registrations]
