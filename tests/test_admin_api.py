"""nsqadmin's JSON API against a real cluster (2 nsqlookupd, 2 nsqd): every route, every
action and its effect on the nodes, the notification POST, ACL denials, unreachable nodes."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.harness import Daemon, wait_for
from tests.support.admin_helpers import Cluster, Graphite, Notifications, addr, cluster, free_port
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def notes() -> Iterator[Notifications]:
    n = Notifications()
    yield n
    n.close()


@pytest.fixture(scope="module")
def nsq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("admin-api")) as c:
        yield c


@pytest.fixture(scope="module")
def admin(nsq: Cluster, notes: Notifications) -> Daemon:
    return nsq.admin(f"--notification-http-endpoint={notes.url}")


def api(admin: Daemon, method: str, path: str, body: Any = None, **headers: str) -> httpx.Response:
    return httpx.request(method, admin.http_url + path, json=body, headers=headers, timeout=10)


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    assert response.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    return response.json()


def test_topics_topic_and_channel_are_summed_over_every_producer(nsq: Cluster, admin: Daemon) -> None:
    nsq.seed("orders", ("billing", "audit"), (7, 5))
    topics = ok(api(admin, "GET", "/api/topics"))
    assert "orders" in topics["topics"] and topics["message"] == ""

    t = ok(api(admin, "GET", "/api/topics/orders"))
    per_node = {addr(n): nsq.topic_stats(n, "orders") for n in nsq.nsqds}
    assert t["node"] == "*" and t["topic_name"] == "orders" and t["message"] == ""
    assert t["message_count"] == sum(s["message_count"] for s in per_node.values()) == 12
    assert t["depth"] == sum(s["depth"] for s in per_node.values())
    assert t["memory_depth"] == t["depth"] - t["backend_depth"]
    assert {n["node"]: n["message_count"] for n in t["nodes"]} == {a: s["message_count"] for a, s in per_node.items()}
    assert [c["channel_name"] for c in t["channels"]] == ["audit", "billing"]
    billing = t["channels"][1]
    assert billing["depth"] == 12 and billing["message_count"] == 12 and len(billing["nodes"]) == 2
    assert set(t) >= {"hostname", "backend_depth", "paused", "e2e_processing_latency"}

    # asked without clients, every clients list is null in Go's answer (recorded)
    assert [c["clients"] for c in t["channels"]] == [None, None]
    assert {str(n["clients"]) for c in t["channels"] for n in c["nodes"]} == {"None"}
    assert {str(c["clients"]) for n in t["nodes"] for c in n["channels"]} == {"None"}

    c = ok(api(admin, "GET", "/api/topics/orders/billing"))
    assert c["channel_name"] == "billing" and c["topic_name"] == "orders" and c["depth"] == 12
    assert sorted(n["depth"] for n in c["nodes"]) == [5, 7]
    for key in ("in_flight_count", "deferred_count", "requeue_count", "timeout_count", "client_count", "clients"):
        assert key in c
    # no consumer anywhere: each node sent [], their sum is Go's append of nothing to nil: null
    assert c["clients"] is None and [n["clients"] for n in c["nodes"]] == [[], []]


def test_an_unknown_topic_is_nsqadmins_upstream_error(nsq: Cluster, admin: Daemon) -> None:
    """nsqadmin asks each lookupd's /lookup: all answer 404, so "failed to query any
    nsqlookupd", each error as Go's http_api client words it (recorded answer)."""
    notfound = r'got response 404 Not Found "{\"message\":\"TOPIC_NOT_FOUND\"}"'
    go = {"message": "UPSTREAM_ERROR: failed to query any nsqlookupd: " + "\n".join([notfound] * 2)}
    for path in ("/api/topics/nosuch", "/api/topics/nosuch/ch"):
        r = api(admin, "GET", path)
        assert (r.status_code, r.json()) == (502, go), path
        assert r.headers["content-type"] == "application/json; charset=utf-8"
    # with --nsqd-http-address, no nsqd holds it: GetNSQDStats of no producers
    direct = nsq.admin(*(f"--nsqd-http-address={addr(n)}" for n in nsq.nsqds))
    r = api(direct, "GET", "/api/topics/nosuch")
    assert (r.status_code, r.json()) == (502, {"message": "UPSTREAM_ERROR: failed to query any nsqd: "})


def test_channel_lists_every_client_with_its_details(nsq: Cluster, admin: Daemon) -> None:
    nsq.seed("clicks", ("web",), (3, 0))
    with RawClient(nsq.nsqds[0].tcp) as client:
        client.identify(client_id="reader-1", hostname="box", user_agent="admin-test/1.0")
        client.subscribe("clicks", "web", rdy=2)
        client.read_messages(2)
        c = wait_for(lambda: (r := ok(api(admin, "GET", "/api/topics/clicks/web")))["clients"] and r, 5,
                     what="client listed")
        [k] = c["clients"]
        assert k["client_id"] == "reader-1" and k["hostname"] == "box" and k["user_agent"] == "admin-test/1.0"
        assert k["node"] == addr(nsq.nsqds[0]) and k["version"] == "V2" and k["ready_count"] == 2
        assert k["in_flight_count"] == 2 and k["tls"] is False and k["deflate"] is False
        assert k["connected"] >= 0 and c["in_flight_count"] == 2 and c["client_count"] == 1
        node = ok(api(admin, "GET", f"/api/nodes/{addr(nsq.nsqds[0])}"))
        assert node["total_clients"] >= 1


def test_nodes_node_and_counter(nsq: Cluster, admin: Daemon) -> None:
    nsq.seed("metrics", ("agg",), (4, 6))
    nodes = ok(api(admin, "GET", "/api/nodes"))["nodes"]
    assert sorted(f"{n['broadcast_address']}:{n['http_port']}" for n in nodes) == sorted(map(addr, nsq.nsqds))
    for n in nodes:
        assert {"topic": "metrics", "tombstoned": False} in n["topics"]
        assert n["version"] == "1.3.0" and n["out_of_date"] is False and n["remote_addresses"]

    second = addr(nsq.nsqds[1])
    node = ok(api(admin, "GET", f"/api/nodes/{second}"))
    stats = nsq.stats(nsq.nsqds[1])
    assert node["node"] == second
    assert node["total_messages"] == sum(t["message_count"] for t in stats["topics"])
    assert sorted(t["topic_name"] for t in node["topics"]) == sorted(t["topic_name"] for t in stats["topics"])
    missing = api(admin, "GET", "/api/nodes/10.9.9.9:1")
    assert missing.status_code == 404 and missing.json() == {"message": "NODE_NOT_FOUND"}

    counter = ok(api(admin, "GET", "/api/counter"))["stats"]
    for nsqd, count in zip(nsq.nsqds, (4, 6)):
        row = counter[f"metrics:agg:{addr(nsqd)}"]
        assert row == {"node": addr(nsqd), "topic_name": "metrics", "channel_name": "agg", "message_count": count}


def test_pause_unpause_empty_reach_every_producer_and_notify(nsq: Cluster, admin: Daemon,
                                                            notes: Notifications) -> None:
    nsq.seed("jobs", ("work",), (3, 4))
    assert ok(api(admin, "POST", "/api/topics/jobs", {"action": "pause"})) == {"message": ""}
    assert all(nsq.topic_stats(n, "jobs")["paused"] for n in nsq.nsqds)
    note = notes.wait("pause_topic", "jobs")
    assert note["via"] and note["url"] == "/api/topics/jobs" and note["remote_ip"] == "127.0.0.1"
    assert isinstance(note["timestamp"], int) and "channel" not in note
    ok(api(admin, "POST", "/api/topics/jobs", {"action": "unpause"}))
    assert not any(nsq.topic_stats(n, "jobs")["paused"] for n in nsq.nsqds)
    notes.wait("unpause_topic", "jobs")

    ok(api(admin, "POST", "/api/topics/jobs/work", {"action": "pause"}))
    assert all(nsq.channel_stats(n, "jobs", "work")["paused"] for n in nsq.nsqds)
    notes.wait("pause_channel", "jobs", "work")
    ok(api(admin, "POST", "/api/topics/jobs/work", {"action": "unpause"}))
    assert not any(nsq.channel_stats(n, "jobs", "work")["paused"] for n in nsq.nsqds)
    notes.wait("unpause_channel", "jobs", "work")

    assert sum(nsq.channel_stats(n, "jobs", "work")["depth"] for n in nsq.nsqds) == 7
    ok(api(admin, "POST", "/api/topics/jobs/work", {"action": "empty"}))
    assert all(nsq.channel_stats(n, "jobs", "work")["depth"] == 0 for n in nsq.nsqds)
    notes.wait("empty_channel", "jobs", "work")

    ok(api(admin, "POST", "/api/topics/jobs", {"action": "pause"}))  # a paused topic keeps its messages
    nsq.publish(nsq.nsqds[0], "jobs", 5)
    assert nsq.topic_stats(nsq.nsqds[0], "jobs")["depth"] == 5
    ok(api(admin, "POST", "/api/topics/jobs", {"action": "empty"}))
    assert nsq.topic_stats(nsq.nsqds[0], "jobs")["depth"] == 0
    notes.wait("empty_topic", "jobs")

    bad = api(admin, "POST", "/api/topics/jobs", {"action": "explode"})
    assert bad.status_code == 400 and bad.json() == {"message": "INVALID_ACTION"}
    garbage = httpx.post(admin.http_url + "/api/topics/jobs", content=b"{nope")
    assert garbage.status_code == 400 and garbage.json() == {"message": "INVALID_BODY"}


def test_create_and_delete_reach_every_lookupd_and_producer(nsq: Cluster, admin: Daemon,
                                                           notes: Notifications) -> None:
    assert ok(api(admin, "POST", "/api/topics", {"topic": "fresh", "channel": "first"})) == {"message": ""}
    for lookupd in nsq.lookupds:
        assert "fresh" in nsq.get(lookupd, "/topics")["topics"]
        assert nsq.get(lookupd, "/channels", topic="fresh")["channels"] == ["first"]
    assert notes.wait("create_topic", "fresh")["topic"] == "fresh"
    notes.wait("create_channel", "fresh", "first")
    inactive = ok(httpx.get(admin.http_url + "/api/topics", params={"inactive": "true"}))
    assert inactive["topics"]["fresh"] == ["first"]
    for body, code in (({"topic": "bad name!"}, "INVALID_TOPIC"),
                       ({"topic": "ok", "channel": "b@d"}, "INVALID_CHANNEL")):
        r = api(admin, "POST", "/api/topics", body)
        assert r.status_code == 400 and r.json() == {"message": code}

    nsq.seed("doomed", ("a", "b"), (2, 2))
    ok(api(admin, "POST", "/api/topics", {"topic": "doomed", "channel": "c"}))  # also on the producers
    assert all(nsq.channel_stats(n, "doomed", "c") is not None for n in nsq.nsqds)

    ok(api(admin, "DELETE", "/api/topics/doomed/a"))
    assert all(nsq.channel_stats(n, "doomed", "a") is None for n in nsq.nsqds)
    for lookupd in nsq.lookupds:
        wait_for(lambda lookupd=lookupd: "a" not in nsq.get(lookupd, "/channels", topic="doomed")["channels"], 5,
                 what="channel gone from lookupd")
    notes.wait("delete_channel", "doomed", "a")

    ok(api(admin, "DELETE", "/api/topics/doomed"))
    assert all(nsq.topic_stats(n, "doomed") is None for n in nsq.nsqds)
    for lookupd in nsq.lookupds:
        wait_for(lambda lookupd=lookupd: "doomed" not in nsq.get(lookupd, "/topics")["topics"], 5,
                 what="topic gone from lookupd")
    notes.wait("delete_topic", "doomed")


def test_tombstone_a_producer_deletes_the_topic_on_that_node_only(nsq: Cluster, admin: Daemon,
                                                                  notes: Notifications) -> None:
    nsq.seed("legacy", ("x",), (1, 1))
    node = addr(nsq.nsqds[0])
    r = api(admin, "DELETE", f"/api/nodes/{node}", {"topic": "legacy"})
    assert ok(r) == {"message": ""}
    assert nsq.topic_stats(nsq.nsqds[0], "legacy") is None
    assert nsq.topic_stats(nsq.nsqds[1], "legacy") is not None
    for lookupd in nsq.lookupds:
        wait_for(lambda lookupd=lookupd: [f"{p['broadcast_address']}:{p['http_port']}" for p in
                                          nsq.get(lookupd, "/lookup", topic="legacy")["producers"]]
                 == [addr(nsq.nsqds[1])], 5, what="only the other producer left")
    assert notes.wait("tombstone_topic_producer", "legacy")["node"] == node
    bad = api(admin, "DELETE", f"/api/nodes/{node}", {"topic": ""})
    assert bad.status_code == 400 and bad.json() == {"message": "INVALID_TOPIC"}


def test_rates_come_from_nsqadmins_own_sampling(nsq: Cluster, admin: Daemon) -> None:
    nsq.seed("stream", ("s",), (1, 1))
    def rates() -> Any:
        return ok(httpx.get(admin.http_url + "/api/rates", params={"topic": "stream"}))
    wait_for(lambda: len(rates()["topic"]) >= 1, 5, what="a first rate point")
    nsq.publish(nsq.nsqds[0], "stream", 500)
    # 500 messages between two 200 ms samples: far above what the 2 seeded ones can give.
    wait_for(lambda: any(rate > 100 for _, rate in rates()["topic"]), 5, what="the topic's rate")
    wait_for(lambda: any(rate > 100 for _, rate in rates()["channels"]["s"]), 5, what="the channel's rate")
    summary = ok(httpx.get(admin.http_url + "/api/rates"))["topics"]["stream"]
    assert summary["channels"] == 1 and summary["nodes"] == 2 and summary["message_count"] == 502


def test_routes_errors_config_and_compression(nsq: Cluster, admin: Daemon) -> None:
    assert httpx.get(admin.http_url + "/ping").text == "OK"
    for page in ("/", "/topics", "/topics/a", "/topics/a/b", "/nodes", "/nodes/x:1", "/counter", "/lookup"):
        r = httpx.get(admin.http_url + page)
        assert r.status_code == 200 and "static/app.js?v=" in r.text
        assert r.headers["content-type"].startswith("text/html")
    assert httpx.get(admin.http_url + "/static/app.css").headers["content-type"].startswith("text/css")
    found = re.search(r"app\.js\?v=(\w+)", httpx.get(admin.http_url + "/").text)
    assert found is not None
    version = found.group(1)
    cached = httpx.get(admin.http_url + "/static/app.js", params={"v": version})
    assert cached.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert httpx.get(admin.http_url + "/static/app.js").headers["cache-control"] == "no-cache"
    slash = httpx.get(admin.http_url + "/topics/a/")
    assert slash.status_code == 301 and slash.headers["location"] == "/topics/a"
    missing = httpx.get(admin.http_url + "/static/nope.js")
    assert missing.status_code == 404 and missing.json() == {"message": "NOT_FOUND"}
    assert httpx.get(admin.http_url + "/api/nothing").json() == {"message": "NOT_FOUND"}
    wrong = httpx.put(admin.http_url + "/api/topics")
    assert wrong.status_code == 405 and wrong.json() == {"message": "METHOD_NOT_ALLOWED"}
    big = httpx.get(admin.http_url + "/static/app.js", headers={"Accept-Encoding": "gzip"})
    assert big.headers.get("content-encoding") == "gzip"
    raw = httpx.get(admin.http_url + "/api/nodes", headers={"Accept-Encoding": "gzip"})
    assert raw.json()["nodes"]

    assert ok(httpx.get(admin.http_url + "/config/nsqlookupd_http_addresses")) == [addr(d) for d in nsq.lookupds]
    assert ok(httpx.put(admin.http_url + "/config/log_level", content=b"debug")) == "debug"
    assert httpx.put(admin.http_url + "/config/log_level", content=b"loud").json() == {"message": "INVALID_VALUE"}
    assert httpx.get(admin.http_url + "/config/nope").json() == {"message": "INVALID_OPTION"}
    graphite = httpx.get(admin.http_url + "/api/graphite", params={"metric": "nope"})
    assert graphite.status_code == 400 and graphite.json() == {"message": "INVALID_ARG_METRIC"}


def test_config_put_swaps_the_lookupds_live(nsq: Cluster, admin: Daemon) -> None:
    url = admin.http_url + "/config/nsqlookupd_http_addresses"
    only_first = [addr(nsq.lookupds[0])]
    assert ok(httpx.put(url, content=b'["%s"]' % only_first[0].encode())) == only_first
    assert ok(httpx.get(url)) == only_first
    assert ok(httpx.get(admin.http_url + "/api/nodes"))["message"] == ""
    assert httpx.put(url, content=b"not json").json() == {"message": "INVALID_VALUE"}
    assert httpx.put(url, content=b"").status_code == 413
    everyone = [addr(d) for d in nsq.lookupds]
    assert ok(httpx.put(url, json=everyone)) == everyone


def test_graphite_rate_and_render_proxy(nsq: Cluster) -> None:
    graphite = Graphite(120.0)
    try:
        g = nsq.admin(f"--graphite-url={graphite.url}", "--proxy-graphite", "--statsd-interval=60s")
        r = ok(httpx.get(g.http_url + "/api/graphite", params={"metric": "rate", "target": "nsq.*.topic.a"}))
        assert r == {"rate": "2.00"}
        asked = graphite.queries[-1]
        assert asked.startswith("/render?") and "from=-120sec" in asked and "until=-60sec" in asked
        proxied = httpx.get(g.http_url + "/render", params={"target": "x", "format": "json"})
        assert proxied.status_code == 200 and proxied.json()[0]["datapoints"] == [[120.0, 1700000000]]
        assert "target=x" in graphite.queries[-1]
        assert f'"graphite_url":"{graphite.url}"' in httpx.get(g.http_url + "/topics/a").text
    finally:
        graphite.close()


def test_config_file_and_dev_static_dir(nsq: Cluster, tmp_path: Path) -> None:
    (tmp_path / "app.js").write_text("/* edited live */")
    config = tmp_path / "nsqadmin.toml"
    lookupds = ", ".join(f'"{addr(d)}"' for d in nsq.lookupds)
    config.write_text(f'nsqlookupd_http_addresses = [{lookupds}]\nadmin_users = ["ops"]\n'
                      f'dev_static_dir = "{tmp_path}"\n')
    a = nsq.admin(f"--config={config}", lookupds=[])
    assert ok(httpx.get(a.http_url + "/config/nsqlookupd_http_addresses")) == [addr(d) for d in nsq.lookupds]
    assert ok(httpx.get(a.http_url + "/config/admin_users")) == ["ops"]
    assert httpx.get(a.http_url + "/static/app.js").text == "/* edited live */"
    assert httpx.post(a.http_url + "/api/topics", json={"topic": "x"}).status_code == 403
    assert a.stop() == 0 and "nsqadmin exited" in a.output  # SIGTERM: a clean shutdown


def test_acl_base_path_and_config_cidr(nsq: Cluster) -> None:
    guarded = nsq.admin("--admin-user=alice", "--admin-user=carol", "--acl-http-header=X-User",
                        "--base-path=/ops/", "--allow-config-from-cidr=10.0.0.0/8")
    nsq.seed("guarded", ("g",), (1, 1))
    base = guarded.http_url + "/ops"
    assert httpx.get(guarded.http_url + "/api/topics").status_code == 404
    assert "guarded" in httpx.get(base + "/api/topics").json()["topics"]
    page = httpx.get(base + "/topics/guarded").text
    assert 'src="/ops/static/app.js?v=' in page and '"is_admin":false' in page
    assert '"is_admin":true' in httpx.get(base + "/", headers={"X-User": "alice"}).text
    for headers in ({}, {"X-User": "bob"}, {"X-Forwarded-User": "alice"}):
        for method, path, body in (("POST", "/api/topics/guarded", {"action": "pause"}),
                                   ("POST", "/api/topics", {"topic": "t"}),
                                   ("DELETE", "/api/topics/guarded/g", None),
                                   ("DELETE", f"/api/nodes/{addr(nsq.nsqds[0])}", {"topic": "guarded"})):
            r = httpx.request(method, base + path, json=body, headers=headers)
            assert r.status_code == 403 and r.json() == {"message": "FORBIDDEN"}, (method, path, headers)
    assert not nsq.topic_stats(nsq.nsqds[0], "guarded")["paused"]
    r = httpx.post(base + "/api/topics/guarded", json={"action": "pause"}, headers={"X-User": "carol"})
    assert r.status_code == 200 and nsq.topic_stats(nsq.nsqds[0], "guarded")["paused"]
    denied = httpx.get(base + "/config/log_level")
    assert denied.status_code == 403 and denied.json() == {"message": "FORBIDDEN"}


def test_unreachable_nodes_are_reported_not_fatal(nsq: Cluster, tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    half = nsq.admin(lookupds=[addr(nsq.lookupds[0]), dead])
    nsq.seed("survive", ("s",), (1, 1))
    for path in ("/api/topics", "/api/nodes", "/api/topics/survive", "/api/topics/survive/s", "/api/counter"):
        r = ok(httpx.get(half.http_url + path))
        assert r["message"].startswith("WARNING: ") and dead in r["message"], (path, r["message"])
    assert ok(httpx.get(half.http_url + "/api/topics/survive"))["message_count"] >= 2
    r = httpx.post(half.http_url + "/api/topics", json={"topic": "partial"})
    assert r.status_code == 200 and r.json()["message"].startswith("WARNING: ")
    assert "partial" in nsq.get(nsq.lookupds[0], "/topics")["topics"]

    gone = nsq.admin(lookupds=[dead])
    r = httpx.get(gone.http_url + "/api/topics")
    assert r.status_code == 502 and r.json()["message"].startswith("UPSTREAM_ERROR: ") and dead in r.json()["message"]
    assert httpx.post(gone.http_url + "/api/topics", json={"topic": "x"}).status_code == 502

    with socket.socket() as hung:  # accepts connections (kernel backlog) but never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        silent = f"127.0.0.1:{hung.getsockname()[1]}"
        slow = nsq.admin("--http-client-request-timeout=300ms", lookupds=[addr(nsq.lookupds[0]), silent])
        r = ok(httpx.get(slow.http_url + "/api/topics"))
        assert "survive" in r["topics"] and r["message"].startswith("WARNING: ") and "timeout" in r["message"]

    direct = nsq.admin(f"--nsqd-http-address={addr(nsq.nsqds[0])}", f"--nsqd-http-address={dead}")
    t = ok(httpx.get(direct.http_url + "/api/topics/survive"))
    assert t["message"].startswith("WARNING: ") and [n["node"] for n in t["nodes"]] == [addr(nsq.nsqds[0])]
    assert "survive" in ok(httpx.get(direct.http_url + "/api/topics"))["topics"]
    assert wait_for(lambda: half.running and gone.running and direct.running, 1)


@pytest.mark.parametrize(("args", "text"), [
    ([], "--nsqd-http-address or --lookupd-http-address required"),
    (["--nsqd-http-address=127.0.0.1:1", "--lookupd-http-address=127.0.0.1:2"], "not both"),
    (["--lookupd-http-address=127.0.0.1:1", "--http-client-tls-cert=/x"], "must both be set"),
    (["--lookupd-http-address=127.0.0.1:1", "--http-address=nonsense"], "http-address"),
])
def test_bad_flags_are_one_line_and_exit_1(args: list[str], text: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pynsqd.admin", *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and text in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("nsqadmin: error: ")
