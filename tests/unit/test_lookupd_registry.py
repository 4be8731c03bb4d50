"""The registration DB and the per-connection session, as pure state with time passed in.

Mirrors NSQ's ``nsqlookupd/registration_db_test.go`` (TestRegistrationDB), then the
TCP session rules of ``lookup_protocol_v1.go`` without a socket.
"""

from __future__ import annotations

import logging

import orjson

from pynsqd.lookupd.registry import (
    CLIENT,
    GO_ZERO_TIME_NS,
    PeerInfo,
    Producer,
    Registration,
    RegistrationDB,
    channel_key,
    filter_by_active,
    keys,
    subkeys,
    topic_key,
)
from pynsqd.lookupd.tcp import LookupSession
from pynsqd.options import MS, SECOND
from pynsqd.wire.lookup import Identify, IdentifyInfo, Ping, Register, Unregister

T0 = 1348797047 * SECOND
SEC30 = 30 * SECOND
LOG = logging.getLogger("test.lookupd")


def peer(n: int, last_update: int = T0) -> PeerInfo:
    return PeerInfo(id=str(n), remote_address=f"remote_addr:{n}", hostname="host",
                    broadcast_address="b_addr", tcp_port=n, http_port=n + 1, version="v1",
                    last_update=last_update)


def ids(producers: list[Producer]) -> list[str]:
    return sorted(p.id for p in producers)


def test_registration_db_like_nsq() -> None:
    pi1, pi2, pi3 = peer(1), peer(2), peer(3)
    p1, p2, p3, p4 = Producer(pi1), Producer(pi2), Producer(pi3), Producer(pi1)
    db = RegistrationDB()
    assert db.add_producer(Registration("c", "a", ""), p1)
    assert db.add_producer(Registration("c", "a", ""), p2)
    assert not db.add_producer(Registration("c", "a", ""), Producer(pi2))  # same id: no-op
    db.add_producer(Registration("c", "a", "b"), p2)
    db.add_producer(Registration("d", "a", ""), p3)
    db.add_producer(Registration("t", "a", ""), p4)

    assert keys(db.find_registrations("c", "*", "")) == ["a"]
    assert ids(db.find_producers("t", "*", "")) == ["1"]
    assert ids(db.find_producers("c", "*", "")) == ["1", "2"]
    assert ids(db.find_producers("c", "a", "")) == ["1", "2"]
    found = db.find_producers("c", "*", "b")
    assert ids(found) == ["2"]

    now = T0 + 60 * SECOND
    assert filter_by_active(found, now, SEC30, SEC30) == []  # last update a minute ago
    pi2.last_update = now
    assert ids(filter_by_active(found, now, SEC30, SEC30)) == ["2"]
    both = db.find_producers("c", "*", "")
    assert ids(filter_by_active(both, now, SEC30, SEC30)) == ["2"]

    pi1.last_update = pi2.last_update = now - 5 * SECOND
    assert ids(filter_by_active(both, now, SEC30, SEC30)) == ["1", "2"]
    p1.tombstone(now)
    assert ids(filter_by_active(both, now, SEC30, SEC30)) == ["2"]
    later = now + 10 * MS
    assert ids(filter_by_active(both, later, SEC30, 5 * MS)) == ["1", "2"]  # tombstone expired
    # A tombstone belongs to one registration: p1's peer is still live under "t" (NSQ #148).
    assert ids(filter_by_active(db.find_producers("t", "*", ""), now, SEC30, SEC30)) == ["1"]

    assert keys(db.find_registrations("c", "b", "")) == []
    assert keys(db.find_registrations("c", "a", "")) == ["a"]
    assert subkeys(db.find_registrations("c", "*", "b")) == ["b"]

    assert db.remove_producer(Registration("c", "a", ""), "1") == (True, 1)
    assert ids(db.find_producers("c", "*", "*")) == ["2"]
    assert db.remove_producer(Registration("c", "a", ""), "2") == (True, 0)
    assert db.remove_producer(Registration("c", "a", "b"), "2") == (True, 0)
    assert db.remove_producer(Registration("c", "a", "b"), "2") == (False, 0)
    assert db.remove_producer(Registration("c", "zz", ""), "2") == (False, 0)
    assert db.find_producers("c", "*", "*") == []

    # Keys outlive their producers until removed.
    assert len(db.find_registrations("c", "*", "*")) == 2
    db.remove_registration(Registration("c", "a", ""))
    db.remove_registration(Registration("c", "a", "b"))
    db.remove_registration(Registration("c", "a", "b"))  # twice is harmless
    assert db.find_registrations("c", "*", "*") == []


def test_wildcards_and_indexes_agree_with_a_scan() -> None:
    db = RegistrationDB()
    for t in ("t1", "t2"):
        db.add_registration(topic_key(t))
        for c in ("c1", "c2"):
            db.add_producer(channel_key(t, c), Producer(peer(1)))
    db.add_registration(channel_key("t1", "empty"))
    assert subkeys(db.find_registrations("channel", "t1", "*")) == ["c1", "c2", "empty"]
    assert db.find_registrations("channel", "*", "c2") == [channel_key("t1", "c2"),
                                                           channel_key("t2", "c2")]
    assert keys(db.find_registrations("topic", "*", "")) == ["t1", "t2"]
    assert db.find_registrations("channel", "t3", "*") == []
    assert set(db.lookup_registrations("1")) == {channel_key(t, c) for t in ("t1", "t2")
                                                 for c in ("c1", "c2")}
    db.remove_registration(channel_key("t1", "c1"))
    assert channel_key("t1", "c1") not in db.lookup_registrations("1")
    assert subkeys(db.find_registrations("channel", "t1", "*")) == ["c2", "empty"]


def test_producer_tombstone_and_go_zero_time() -> None:
    p = Producer(peer(1))
    assert p.tombstoned_at == GO_ZERO_TIME_NS == -6795364578871345152
    assert not p.is_tombstoned(SEC30, T0)
    p.tombstone(T0)
    assert p.is_tombstoned(SEC30, T0 + SEC30 - 1)
    assert not p.is_tombstoned(SEC30, T0 + SEC30)
    assert not p.is_tombstoned(0, T0)  # /nodes filters with lifetime 0: tombstoned stay
    # Inactivity: exactly at the timeout is still active; one ns later it is gone.
    assert filter_by_active([p], T0 + SEC30, SEC30, 0) == [p]
    assert filter_by_active([p], T0 + SEC30 + 1, SEC30, 0) == []


# --- the session (lookup_protocol_v1.go without the socket) -----------------------------

INFO = IdentifyInfo("b_addr", 4150, 4151, "1.3.0", "host")


def session(db: RegistrationDB, remote: str = "127.0.0.1:5000") -> LookupSession:
    return LookupSession(db, remote, b'{"identify":"reply"}', LOG)


def test_session_identify_register_and_disconnect() -> None:
    db = RegistrationDB()
    s = session(db)
    assert s.handle(Ping(), T0) == b"OK"  # PING before IDENTIFY is fine
    assert s.handle(Identify(INFO), T0) == b'{"identify":"reply"}'
    assert ids(db.find_producers("client", "", "")) == ["127.0.0.1:5000"]
    assert s.handle(Register("t", "c"), T0) == b"OK"
    assert ids(db.find_producers("topic", "t", "")) == ["127.0.0.1:5000"]
    assert ids(db.find_producers("channel", "t", "c")) == ["127.0.0.1:5000"]
    # One PeerInfo shared by every registration; PING refreshes it everywhere.
    s.handle(Ping(), T0 + SECOND)
    everywhere = db.find_producers("topic", "*", "") + db.find_producers("channel", "*", "*")
    assert {p.peer.last_update for p in everywhere} == {T0 + SECOND}
    s.close()
    assert db.find_producers("client", "", "") == []
    assert db.find_producers("topic", "t", "") == []
    assert topic_key("t") in db and channel_key("t", "c") in db and CLIENT in db


def test_session_unregister_rules() -> None:
    db = RegistrationDB()
    s = session(db)
    s.handle(Identify(INFO), T0)
    for topic, channel in (("t", "c"), ("t", "e#ephemeral"), ("e#ephemeral", "c")):
        s.handle(Register(topic, channel), T0)
    # A channel: the producer goes, the registration stays unless ephemeral and empty.
    s.handle(Unregister("t", "c"), T0)
    assert channel_key("t", "c") in db and db.find_producers("channel", "t", "c") == []
    assert ids(db.find_producers("topic", "t", "")) == ["127.0.0.1:5000"]
    s.handle(Unregister("t", "e#ephemeral"), T0)
    assert channel_key("t", "e#ephemeral") not in db
    # A topic: out of every channel of it and the topic; an empty ephemeral topic goes.
    s.handle(Unregister("e#ephemeral", None), T0)
    assert topic_key("e#ephemeral") not in db
    assert channel_key("e#ephemeral", "c") in db
    assert db.find_producers("channel", "e#ephemeral", "c") == []
    s.handle(Unregister("t", None), T0)
    assert topic_key("t") in db and db.find_producers("topic", "t", "") == []


def test_ephemeral_channel_kept_while_another_producer_holds_it() -> None:
    db = RegistrationDB()
    a, b = session(db, "10.0.0.1:1"), session(db, "10.0.0.2:1")
    for s in (a, b):
        s.handle(Identify(INFO), T0)
        s.handle(Register("t", "e#ephemeral"), T0)
    a.handle(Unregister("t", "e#ephemeral"), T0)
    assert ids(db.find_producers("channel", "t", "e#ephemeral")) == ["10.0.0.2:1"]
    b.close()
    a.close()
    assert channel_key("t", "e#ephemeral") in db  # disconnect never removes registrations
    assert orjson.loads(session(db).identify_response) == {"identify": "reply"}
