"""nsqadmin benchmark: how fast the topics page and a topic page (and their /api calls) are
served for a big cluster — by default 200 topics x 5 channels on each of 3 nsqd nodes.

Starts one nsqlookupd, N nsqd nodes registered with it, fills every node with the topics and
channels (and one message per topic), then starts nsqadmin against the lookupd and times,
over keep-alive HTTP, each request a page makes: the HTML, then its /api calls. A page's
figure is the HTML plus its API calls one after another (what a browser waits for before
the numbers appear). Prints the median and p90 of each request in ms, per run, and the
median over runs. With ``--browser``, headless Chromium (Debian's, via Playwright) also
loads each page and reports ``load_ms``: from navigation start until the page's numbers are
rendered (measured inside the page; median over loads after a warm-up one).

  .venv/bin/python bench/bench_admin.py --repeat 3 --requests 20 --browser
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Figures, report  # noqa: E402
from testbed.harness import Daemon, wait_for  # noqa: E402

# page → [(label, path)]: the HTML, then the /api calls its script makes.
PAGES = {
    "topics": [("html", "/"), ("api", "/api/topics"), ("rates", "/api/rates")],
    "topic": [("html", "/topics/topic-000"), ("api", "/api/topics/topic-000"),
              ("rates", "/api/rates?topic=topic-000")],
    "channel": [("html", "/topics/topic-000/channel-0"), ("api", "/api/topics/topic-000/channel-0"),
                ("rates", "/api/rates?topic=topic-000")],
}


def build(args: argparse.Namespace, tmp: str) -> tuple[list[Daemon], Daemon]:
    lookupd = Daemon("pynsqd.lookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                        "--broadcast-address=127.0.0.1"]).start()
    daemons = [lookupd]
    with httpx.Client(timeout=30) as http:
        for i in range(args.nodes):
            node = Daemon("pynsqd.supervisor", [
                "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp}/n{i}",
                "--broadcast-address=127.0.0.1", f"--lookupd-tcp-address=127.0.0.1:{lookupd.tcp[1]}"])
            Path(f"{tmp}/n{i}").mkdir()
            daemons.append(node.start())
            for t in range(args.topics):
                topic = f"topic-{t:03d}"
                http.post(f"{node.http_url}/topic/create", params={"topic": topic}).raise_for_status()
                for c in range(args.channels):
                    http.post(f"{node.http_url}/channel/create",
                              params={"topic": topic, "channel": f"channel-{c}"}).raise_for_status()
                http.post(f"{node.http_url}/pub", params={"topic": topic}, content=b"x").raise_for_status()

        def registered() -> bool:
            producers = http.get(f"{lookupd.http_url}/nodes").json()["producers"]
            return len(producers) == args.nodes and all(len(p["topics"]) == args.topics for p in producers)
        wait_for(registered, 60, interval=0.2, what="every topic registered")
    admin = Daemon("pynsqd.admin", ["--http-address=127.0.0.1:0", f"--lookupd-http-address={lookupd.http_url[7:]}"],
                   listeners=("HTTP",)).start()
    daemons.append(admin)
    return daemons, admin


def one_run(args: argparse.Namespace) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        daemons, admin = build(args, tmp)
        try:
            figures: Figures = {}
            with httpx.Client(base_url=admin.http_url, timeout=30) as http:
                wait_for(lambda: http.get("/api/rates").json()["samples"] > 0, 30, what="a first sample")
                for page, calls in PAGES.items():
                    times: dict[str, list[float]] = {label: [] for label, _ in calls}
                    for _ in range(args.requests):
                        for label, path in calls:
                            start = time.perf_counter()
                            response = http.get(path)
                            times[label].append((time.perf_counter() - start) * 1000)
                            response.raise_for_status()
                    row = {}
                    for name, samples in times.items():
                        row[f"{name}_p50"] = statistics.median(samples)
                        row[f"{name}_p90"] = statistics.quantiles(samples, n=10)[-1]
                    row["page_ms"] = sum(statistics.median(s) for s in times.values())
                    figures[page] = row
            if args.browser:
                for page, load_ms in browser_loads(admin.http_url, args.requests).items():
                    figures[page]["load_ms"] = load_ms
            return figures
        finally:
            for daemon in reversed(daemons):
                daemon.stop()


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# Set in the page: ms from navigation start until the script first marks the numbers rendered.
_MARK_RENDERED = """
new MutationObserver(function () {
  if (!window.__rendered && document.body && document.body.dataset.loaded) window.__rendered = performance.now();
}).observe(document, {attributes: true, subtree: true});
"""


def browser_loads(base: str, count: int) -> dict[str, float]:
    """Median ms from navigation start until each page shows its numbers (after one warm-up
    load per page, as a user's second visit: assets cached, connections open)."""
    from playwright.sync_api import sync_playwright
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.add_init_script(_MARK_RENDERED)
        for name, calls in PAGES.items():
            samples = []
            for i in range(count + 1):
                page.goto(base + calls[0][1])
                page.wait_for_function("window.__rendered !== undefined")
                if i:
                    samples.append(float(page.evaluate("window.__rendered")))
            out[name] = statistics.median(samples)
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--channels", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20, help="timed requests per URL per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--browser", action="store_true", help="also time page loads in headless Chromium")
    args = parser.parse_args()
    report(one_run, args, f"{args.topics} topics x {args.channels} channels x {args.nodes} nodes, latency in ms")


if __name__ == "__main__":
    main()
