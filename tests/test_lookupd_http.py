"""The real nsqlookupd's HTTP API: NSQ's nsqlookupd/http_test.go, every route's error paths,
and the router's conventions (404, 405 + Allow, OPTIONS, redirects, headers)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from pynsqd import NSQ_VERSION
from pynsqd.httpkit import go_json, parse_query
from pynsqd.wire.lookup import IdentifyInfo, encode_register
from testbed.harness import Daemon
from tests.support.lookupd_helpers import Producer, http, lookupd

pytestmark = pytest.mark.fast

NSQ_HEADER = "nsq; version=1.0"
JSON = "application/json; charset=utf-8"


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with lookupd() as started:
        yield started


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with http(daemon) as c:
        yield c


def check_error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text
    assert r.content == b'{"message":"%s"}' % message.encode()
    assert r.headers["content-type"] == JSON
    assert r.headers["x-nsq-content-type"] == NSQ_HEADER


def check_empty_ok(r: httpx.Response) -> None:
    assert (r.status_code, r.content) == (200, b""), r.text
    assert r.headers["x-nsq-content-type"] == NSQ_HEADER
    assert "content-type" not in r.headers


def test_ping(client: httpx.Client) -> None:
    r = client.get("/ping")
    assert (r.status_code, r.text) == (200, "OK")
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert "x-nsq-content-type" not in r.headers


def test_info(client: httpx.Client) -> None:
    r = client.get("/info")
    assert (r.status_code, r.content) == (200, b'{"version":"%s"}' % NSQ_VERSION.encode())
    assert r.headers["content-type"] == JSON and r.headers["x-nsq-content-type"] == NSQ_HEADER


def test_create_topic(client: httpx.Client) -> None:
    check_error(client.post("/topic/create"), 400, "MISSING_ARG_TOPIC")
    check_error(client.post("/topic/create?topic=sampletopicA$"), 400, "INVALID_ARG_TOPIC")
    check_error(client.post("/topic/create?topic="), 400, "INVALID_ARG_TOPIC")
    check_empty_ok(client.post("/topic/create?topic=sampletopicA"))
    assert "sampletopicA" in client.get("/topics").json()["topics"]
    r = client.get("/lookup?topic=sampletopicA")
    assert r.json() == {"channels": [], "producers": []}


def test_delete_topic(client: httpx.Client) -> None:
    check_error(client.post("/topic/delete"), 400, "MISSING_ARG_TOPIC")
    check_empty_ok(client.post("/topic/delete?topic=never_existed"))  # no 404
    client.post("/topic/create?topic=del_topic")
    check_empty_ok(client.post("/topic/delete?topic=del_topic"))
    client.post("/channel/create?topic=del_topic2&channel=c1")
    client.post("/channel/create?topic=del_topic2&channel=c2")
    check_empty_ok(client.post("/topic/delete?topic=del_topic2"))
    topics = client.get("/topics").json()["topics"]
    assert "del_topic" not in topics and "del_topic2" not in topics
    assert client.get("/channels?topic=del_topic2").json() == {"channels": []}
    check_error(client.get("/lookup?topic=del_topic2"), 404, "TOPIC_NOT_FOUND")


def test_get_channels(client: httpx.Client) -> None:
    check_error(client.get("/channels"), 400, "MISSING_ARG_TOPIC")
    client.post("/topic/create?topic=chan_topic")
    r = client.get("/channels?topic=chan_topic")
    assert r.content == b'{"channels":[]}' and r.headers["content-type"] == JSON
    assert client.get("/channels?topic=unknown$topic").json() == {"channels": []}  # no validation
    client.post("/channel/create?topic=chan_topic&channel=chan1")
    assert client.get("/channels?topic=chan_topic").json() == {"channels": ["chan1"]}


def test_create_channel(client: httpx.Client) -> None:
    check_error(client.post("/channel/create"), 400, "MISSING_ARG_TOPIC")
    check_error(client.post("/channel/create?topic=sampletopicB$"), 400, "INVALID_ARG_TOPIC")
    check_error(client.post("/channel/create?topic=sampletopicB"), 400, "MISSING_ARG_CHANNEL")
    check_error(client.post("/channel/create?topic=sampletopicB&channel=foobar$"), 400,
                "INVALID_ARG_CHANNEL")
    check_empty_ok(client.post("/channel/create?topic=sampletopicB&channel=foobar"))
    assert "sampletopicB" in client.get("/topics").json()["topics"]  # the topic comes too
    assert client.get("/lookup?topic=sampletopicB").json() == {"channels": ["foobar"],
                                                               "producers": []}


def test_delete_channel(client: httpx.Client) -> None:
    check_error(client.post("/channel/delete"), 400, "MISSING_ARG_TOPIC")
    check_error(client.post("/channel/delete?topic=sampletopicC$"), 400, "INVALID_ARG_TOPIC")
    check_error(client.post("/channel/delete?topic=sampletopicC"), 400, "MISSING_ARG_CHANNEL")
    check_error(client.post("/channel/delete?topic=sampletopicC&channel=foobar$"), 400,
                "INVALID_ARG_CHANNEL")
    check_error(client.post("/channel/delete?topic=sampletopicC&channel=foobar"), 404,
                "CHANNEL_NOT_FOUND")
    client.post("/channel/create?topic=sampletopicC&channel=foobar")
    check_empty_ok(client.post("/channel/delete?topic=sampletopicC&channel=foobar"))
    assert client.get("/channels?topic=sampletopicC").json() == {"channels": []}


def test_lookup_errors(client: httpx.Client) -> None:
    check_error(client.get("/lookup"), 400, "MISSING_ARG_TOPIC")
    check_error(client.get("/lookup?topic="), 404, "TOPIC_NOT_FOUND")
    check_error(client.get("/lookup?topic=nope"), 404, "TOPIC_NOT_FOUND")
    check_error(client.get("/lookup?topic=%zz"), 400, "INVALID_REQUEST")
    check_error(client.get("/lookup?topic=a;b"), 400, "INVALID_REQUEST")


def test_tombstone_errors(client: httpx.Client) -> None:
    check_error(client.post("/topic/tombstone"), 400, "MISSING_ARG_TOPIC")
    check_error(client.post("/topic/tombstone?topic=t"), 400, "MISSING_ARG_NODE")
    check_empty_ok(client.post("/topic/tombstone?topic=t&node=nobody:1"))  # no match: no-op


def test_debug_nodes_and_lookup_with_a_producer(daemon: Daemon, client: httpx.Client) -> None:
    with Producer(daemon) as p:
        p.identify(IdentifyInfo("debug.node", 7000, 7001, "1.3.0", "debughost"))
        assert p.command(encode_register("debug_topic", "debug_chan")) == b"OK"
        host, port = p.sock.getsockname()[:2]
        me = f"{host}:{port}"
        debug = client.get("/debug")
        assert debug.headers["content-type"] == JSON
        data = debug.json()
        entries = {k: [e for e in v if e["id"] == me] for k, v in data.items()}
        assert list(data) == sorted(data)  # a Go map: keys sorted
        for key in ("client::", "topic:debug_topic:", "channel:debug_topic:debug_chan"):
            (entry,) = entries[key]
            assert list(entry) == sorted(entry)
            assert entry == {"broadcast_address": "debug.node", "hostname": "debughost",
                             "http_port": 7001, "id": me, "last_update": entry["last_update"],
                             "tcp_port": 7000, "tombstoned": False,
                             "tombstoned_at": -6795364578871345152, "version": "1.3.0"}
        client.post("/topic/tombstone?topic=debug_topic&node=debug.node:7001")
        (entry,) = [e for e in client.get("/debug").json()["topic:debug_topic:"] if e["id"] == me]
        assert entry["tombstoned"] is True and entry["tombstoned_at"] > entry["last_update"] - 1
        (node,) = [n for n in client.get("/nodes").json()["producers"] if n["remote_address"] == me]
        assert list(node) == ["remote_address", "hostname", "broadcast_address", "tcp_port",
                              "http_port", "version", "tombstones", "topics"]
        assert node["tombstones"] == [True] and node["topics"] == ["debug_topic"]
        lookup = client.get("/lookup?topic=debug_topic")
        assert lookup.content == b'{"channels":["debug_chan"],"producers":[]}'


def test_unknown_paths_and_methods(client: httpx.Client) -> None:
    check_error(client.get("/nope"), 404, "NOT_FOUND")
    check_error(client.post("/nope"), 404, "NOT_FOUND")
    check_error(client.get("/debug/pprof"), 404, "NOT_FOUND")
    r = client.post("/ping")
    check_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "GET, OPTIONS"
    r = client.get("/topic/create?topic=x")
    check_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "POST, OPTIONS"
    r = client.head("/ping")
    assert r.status_code == 405 and r.headers["allow"] == "GET, OPTIONS"
    r = client.options("/lookup")
    assert (r.status_code, r.content, r.headers["allow"]) == (200, b"", "GET, OPTIONS")


def test_redirects_like_httprouter(client: httpx.Client) -> None:
    r = client.get("/ping/")
    assert (r.status_code, r.headers["location"]) == (301, "/ping")
    r = client.get("/LOOKUP?topic=x")
    assert (r.status_code, r.headers["location"]) == (301, "/lookup?topic=x")
    r = client.post("/topic/create/?topic=x")
    assert (r.status_code, r.headers["location"], r.content) == (307, "/topic/create?topic=x", b"")
    check_error(client.post("/ping/"), 404, "NOT_FOUND")  # no POST route to fix it to


def test_go_json_and_query_parsing() -> None:
    assert go_json({"a": "<&>\u2028"}) == b'{"a":"\\u003c\\u0026\\u003e\\u2028"}'
    assert parse_query(b"topic=a+b&topic=c&x&=v&&n=%41") == {
        "topic": ["a b", "c"], "x": [""], "": ["v"], "n": ["A"]}
