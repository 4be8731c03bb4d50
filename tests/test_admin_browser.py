"""nsqadmin in headless Chromium (Debian's ``chromium`` driven by Playwright): every page
against ``/stats``, the actions through the UI with their confirmation, a live counter.

Screenshots go to ``tests/artifacts/admin/`` (git-ignored) so a run can be looked at.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.harness import Daemon, scaled, wait_for
from tests.support.admin_helpers import AuthProxy, Cluster, Graphite, addr, cluster
from tests.support.rawclient import RawClient

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).parent / "artifacts" / "admin"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (scripts/setup)")]


@pytest.fixture(scope="module")
def nsq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("admin-ui")) as c:
        yield c


@pytest.fixture(scope="module")
def admin(nsq: Cluster) -> Daemon:
    return nsq.admin()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    errors: list[str] = []
    pg = browser.new_page(viewport={"width": 1360, "height": 900})
    pg.set_default_timeout(scaled(10) * 1000)
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    pg.close()
    assert not errors, f"script errors in the page: {errors}"


def open_page(pg: Any, url: str, refreshes: int = 1) -> None:
    pg.goto(url)
    pg.wait_for_function(f"Number(document.body.dataset.loaded || 0) >= {refreshes}")


def shot(pg: Any, name: str) -> None:
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def shown(pg: Any, selector: str) -> int:
    """The number a cell or card shows (its text, thousands separators removed)."""
    return int(pg.locator(selector).first.inner_text().replace(",", "").strip())


def wait_shown(pg: Any, selector: str, expected: int) -> None:
    wait_for(lambda: pg.locator(selector).count() and shown(pg, selector) == expected, 10,
             interval=0.1, what=f"{selector} to show {expected}")


def confirm(pg: Any, button: str) -> None:
    pg.locator(button).first.click()
    pg.locator("#modal").wait_for(state="visible")
    pg.locator("#modal-ok").click()
    pg.locator("#modal").wait_for(state="hidden")


def test_every_page_shows_the_numbers_of_stats(nsq: Cluster, admin: Daemon, page: Any) -> None:
    nsq.seed("shop", ("pack", "ship"), (6, 9))
    base = admin.http_url
    with RawClient(nsq.nsqds[1].tcp) as client:
        client.identify(client_id="packer-7", hostname="warehouse", user_agent="ui-test/2.0")
        client.subscribe("shop", "pack", rdy=1)
        client.read_message()

        open_page(page, f"{base}/topics/shop/pack")
        wait_for(lambda: page.locator('tr[data-client="packer-7"]').count() == 1, 10, interval=0.1, what="client row")
        row = page.locator('tr[data-client="packer-7"]')
        assert "warehouse" in row.inner_text() and "ui-test/2.0" in row.inner_text()
        assert shown(page, 'tr[data-client="packer-7"] [data-stat="in_flight_count"]') == 1
        assert shown(page, 'tr[data-client="packer-7"] [data-stat="ready_count"]') == 1
        for nsqd in nsq.nsqds:
            c = nsq.channel_stats(nsqd, "shop", "pack")
            for key in ("depth", "in_flight_count", "message_count", "requeue_count", "client_count"):
                assert shown(page, f'tr[data-node="{addr(nsqd)}"] [data-stat="{key}"]') == c[key], key
        assert shown(page, 'tfoot [data-stat="message_count"]') == 15
        shot(page, "channel")

        open_page(page, f"{base}/topics/shop")
        for nsqd in nsq.nsqds:  # a topic's in-flight count is its channels' on that node
            expected = sum(c["in_flight_count"] for c in nsq.topic_stats(nsqd, "shop")["channels"])
            assert shown(page, f'tr[data-node="{addr(nsqd)}"] [data-stat="in_flight_count"]') == expected
        assert shown(page, 'tfoot [data-stat="in_flight_count"]') == 1

    open_page(page, f"{base}/topics/shop")
    for nsqd in nsq.nsqds:
        t = nsq.topic_stats(nsqd, "shop")
        for key in ("depth", "message_count", "backend_depth"):
            assert shown(page, f'tr[data-node="{addr(nsqd)}"] [data-stat="{key}"]') == t[key], key
    assert shown(page, '.cards [data-stat="message_count"]') == 15
    for channel in ("pack", "ship"):
        total = sum(nsq.channel_stats(n, "shop", channel)["depth"] for n in nsq.nsqds)
        wait_shown(page, f'tr[data-channel="{channel}"] [data-stat="depth"]', total)
    shot(page, "topic")

    open_page(page, f"{base}/")
    wait_shown(page, 'tr[data-topic="shop"] [data-stat="message_count"]', 15)
    wait_shown(page, 'tr[data-topic="shop"] [data-stat="channels"]', 2)
    shot(page, "topics")

    open_page(page, f"{base}/nodes")
    for nsqd in nsq.nsqds:
        assert shown(page, f'tr[data-node="{addr(nsqd)}"] [data-stat="tcp_port"]') == nsqd.tcp[1]
    shot(page, "nodes")

    first = nsq.nsqds[0]
    open_page(page, f"{base}/nodes/{addr(first)}")
    assert shown(page, '[data-stat="total_messages"]') == sum(t["message_count"] for t in nsq.stats(first)["topics"])
    assert shown(page, 'tr[data-channel="shop/ship"] [data-stat="depth"]') == 6
    shot(page, "node")

    open_page(page, f"{base}/counter")
    expected = sum(c["message_count"] for n in nsq.nsqds for t in nsq.stats(n)["topics"] for c in t["channels"])
    assert shown(page, '[data-stat="total"]') == expected
    shot(page, "counter")

    open_page(page, f"{base}/lookup")
    page.fill("#create input[name=topic]", "from-ui")
    page.fill("#create input[name=channel]", "made-here")
    page.click("#create button[type=submit]")
    for lookupd in nsq.lookupds:
        wait_for(lambda lookupd=lookupd: "made-here" in nsq.get(lookupd, "/channels", topic="from-ui")["channels"],
                 10, what="lookupd knows the new channel")
    wait_for(lambda: page.locator('tr[data-topic="from-ui"]').count() == 1, 10, interval=0.1,
             what="the new topic listed as without producers")
    shot(page, "lookup")


def test_actions_through_the_ui_with_confirmation(nsq: Cluster, admin: Daemon, page: Any) -> None:
    nsq.seed("ui", ("keep", "drop"), (4, 3))
    base = admin.http_url
    open_page(page, f"{base}/topics/ui")
    page.locator('#buttons button[data-action="pause"]').click()
    page.locator("#modal").wait_for(state="visible")
    assert "Pause topic ui?" in page.locator("#modal-text").inner_text()
    shot(page, "confirm-pause")
    page.locator("#modal-ok").click()
    wait_for(lambda: all(nsq.topic_stats(n, "ui")["paused"] for n in nsq.nsqds), 10, what="topic paused on both")
    page.locator("h1 ~ #buttons").wait_for()
    wait_for(lambda: page.locator('#buttons button[data-action="unpause"]').count() == 1, 10, interval=0.1,
             what="the Unpause button")
    confirm(page, '#buttons button[data-action="unpause"]')
    wait_for(lambda: not any(nsq.topic_stats(n, "ui")["paused"] for n in nsq.nsqds), 10, what="topic unpaused")

    open_page(page, f"{base}/topics/ui/keep")
    page.locator('#buttons button[data-action="delete"]').click()
    page.locator("#modal-cancel").click()  # cancelled: nothing happens
    confirm(page, '#buttons button[data-action="pause"]')
    wait_for(lambda: all(nsq.channel_stats(n, "ui", "keep")["paused"] for n in nsq.nsqds), 10, what="channel paused")
    confirm(page, '#buttons button[data-action="empty"]')
    wait_for(lambda: all(nsq.channel_stats(n, "ui", "keep")["depth"] == 0 for n in nsq.nsqds), 10,
             what="channel emptied")
    assert all(nsq.channel_stats(n, "ui", "drop")["depth"] > 0 for n in nsq.nsqds)
    wait_shown(page, '.cards [data-stat="depth"]', 0)
    shot(page, "channel-paused-emptied")

    open_page(page, f"{base}/topics/ui/drop")
    confirm(page, '#buttons button[data-action="delete"]')
    page.wait_for_url(f"{base}/topics/ui")
    wait_for(lambda: all(nsq.channel_stats(n, "ui", "drop") is None for n in nsq.nsqds), 10, what="channel deleted")

    open_page(page, f"{base}/topics/ui")
    first = addr(nsq.nsqds[0])
    confirm(page, f'button[data-action="tombstone"][data-node="{first}"]')
    wait_for(lambda: nsq.topic_stats(nsq.nsqds[0], "ui") is None, 10, what="topic deleted on the tombstoned node")
    assert nsq.topic_stats(nsq.nsqds[1], "ui") is not None
    wait_for(lambda: page.locator(f'tr[data-node="{first}"]').count() == 0, 10, interval=0.1,
             what="the tombstoned node's row gone")
    shot(page, "tombstoned")

    confirm(page, '#buttons button[data-action="delete"]')
    page.wait_for_url(f"{base}/topics")
    wait_for(lambda: all(nsq.topic_stats(n, "ui") is None for n in nsq.nsqds), 10, what="topic deleted")
    open_page(page, f"{base}/topics", refreshes=2)
    assert page.locator('tr[data-topic="ui"]').count() == 0


def test_live_counter_and_rate_graph_move_while_a_producer_runs(nsq: Cluster, admin: Daemon, page: Any) -> None:
    nsq.seed("live", ("tail",), (1, 1))
    stop = threading.Event()

    def produce() -> None:
        with httpx.Client(base_url=nsq.nsqds[0].http_url) as client:
            while not stop.is_set():
                client.post("/mpub", params={"topic": "live"}, content=b"a\nb\nc\nd\ne")
                stop.wait(0.02)

    producer = threading.Thread(target=produce)
    open_page(page, f"{admin.http_url}/counter")
    page.evaluate("window.__sameDocument = true")
    producer.start()
    try:
        first = shown(page, '[data-stat="total"]')
        wait_for(lambda: shown(page, '[data-stat="total"]') > first + 50, 10, interval=0.1, what="counter moving")
        second = shown(page, '[data-stat="total"]')
        wait_for(lambda: shown(page, '[data-stat="total"]') > second, 10, interval=0.1, what="counter still moving")
        assert page.evaluate("window.__sameDocument") is True  # updated in place, never reloaded
        wait_for(lambda: float(page.locator('[data-stat="rate"]').inner_text().split()[0].replace(",", "")) > 0,
                 10, interval=0.1, what="a rate shown")
        shot(page, "counter-live")

        open_page(page, f"{admin.http_url}/topics/live")
        wait_for(lambda: page.locator(".graph svg").count() == 1 and float(
            page.locator('.graph [data-stat="rate"]').inner_text().split()[0].replace(",", "")) > 0,
            10, interval=0.1, what="the sampled rate graph")
        shot(page, "topic-rate-graph")
    finally:
        stop.set()
        producer.join()


def test_behind_an_auth_proxy_at_a_base_path(nsq: Cluster, page: Any) -> None:
    nsq.seed("behind", ("proxy",), (2, 3))
    guarded = nsq.admin("--base-path=/nsq", "--admin-user=alice", "--acl-http-header=X-Forwarded-User")
    proxy = AuthProxy(guarded.http_url, "X-Forwarded-User", "alice")
    try:
        # Straight to nsqadmin, nobody is named: the numbers show, the actions do not.
        open_page(page, f"{guarded.http_url}/nsq/topics/behind")
        assert shown(page, '.cards [data-stat="message_count"]') == 5
        assert page.locator("button[data-action]").count() == 0
        shot(page, "not-admin")

        # Through the proxy, alice is named: links stay under /nsq and the actions work.
        open_page(page, f"{proxy.url}/nsq/topics/behind")
        assert page.locator('a[data-nav="nodes"]').get_attribute("href") == "/nsq/nodes"
        page.click('tr[data-channel="proxy"] a')
        page.wait_for_url(f"{proxy.url}/nsq/topics/behind/proxy")
        page.wait_for_function("Number(document.body.dataset.loaded || 0) >= 1")
        assert shown(page, 'tfoot [data-stat="depth"]') == 5
        confirm(page, '#buttons button[data-action="pause"]')
        wait_for(lambda: all(nsq.channel_stats(n, "behind", "proxy")["paused"] for n in nsq.nsqds), 10,
                 what="channel paused through the proxy")
        wait_for(lambda: page.locator('#buttons button[data-action="unpause"]').count() == 1, 10, interval=0.1,
                 what="the Unpause button")
        assert page.locator("#state .badge.paused").count() == 1
        shot(page, "base-path-proxy")
    finally:
        proxy.close()


def test_graphite_graphs_beside_the_sampled_ones(nsq: Cluster, page: Any) -> None:
    nsq.seed("graphed", ("g",), (1, 1))
    graphite = Graphite(60.0)
    try:
        g = nsq.admin(f"--graphite-url={graphite.url}", "--proxy-graphite")
        open_page(page, f"{g.http_url}/topics/graphed/g")
        src = page.locator(".graphite img").get_attribute("src")
        assert src is not None and src.startswith("/render?")
        assert "topic.graphed.channel.g.message_count" in httpx.URL(g.http_url + src).params["target"]
        wait_for(lambda: any(q.startswith("/render?") and "graphed" in q for q in graphite.queries), 10,
                 what="the browser's graphite request, through nsqadmin's /render proxy")
        assert page.locator(".graph svg, .graph.empty").count() >= 1  # nsqadmin's own graph is still there
    finally:
        graphite.close()
