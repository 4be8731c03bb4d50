"""``nsq_to_http``: consume a topic and make an HTTP request per message (GET or POST).

``--get URL`` replaces ``%s`` in URL with the URL-escaped body; ``--post URL`` sends the body.
Several URLs are chosen by ``--mode`` (``pynsqd.tools.upstream``). A message is FINed once a
request returned 2xx; an error or another status REQs it with backoff, which is the retry:
nsqd delivers it again, up to the consumer's ``max_attempts`` (``--consumer-opt``). ``-n``
requests run at most at once; ``--sample`` passes only that fraction of messages (the rest
are FINed). SIGINT/SIGTERM: stop consuming, finish the requests in flight, exit 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
import urllib.parse

import httpx

from pynsqd.client import Message, NSQError
from pynsqd.client import http as nsq_http
from pynsqd.options import SECOND, UsageError, flag
from pynsqd.shared_flags import http_connect_timeout_flag, http_request_timeout_flag
from pynsqd.tools import common
from pynsqd.tools.upstream import MODES, Upstreams

log = logging.getLogger("pynsqd.tools")
PROG = "nsq_to_http"


@dataclasses.dataclass
class Options(common.ConsumerFlags):
    channel: str = flag("channel", "nsq_to_http", "nsq channel")
    topic: str = flag("topic", "", "nsq topic")
    get: list[str] = flag("get", [], "HTTP address to make a GET request to. '%s' will be printf replaced "
                          "with data", kind="strlist")
    post: list[str] = flag("post", [], "HTTP address to make a POST request to.  data will be in the body",
                           kind="strlist")
    content_type: str = flag("content-type", "application/octet-stream",
                             "the Content-Type used for POST requests")
    headers: list[str] = flag("header", [], "Custom header for HTTP requests", kind="strlist")
    mode: str = flag("mode", "hostpool", "the upstream request mode options: round-robin, hostpool (default), "
                     "epsilon-greedy")
    publishers: int = flag("n", 100, "number of concurrent publishers")
    sample: float = flag("sample", 1.0, "% of messages to publish (float b/w 0 -> 1)")
    status_every: int = flag("status-every", 250, "the # of requests between logging status (per handler), "
                             "0 disables")
    http_client_connect_timeout: int = http_connect_timeout_flag()
    http_client_request_timeout: int = http_request_timeout_flag(20 * SECOND)


def parse_headers(raw: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in raw:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"invalid --header {item!r}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


class Forwarder:
    def __init__(self, opts: Options, client: httpx.AsyncClient, rng: random.Random) -> None:
        self.opts = opts
        self.client = client
        self.rng = rng
        self.method = "POST" if opts.post else "GET"
        self.upstreams = Upstreams(opts.post or opts.get, opts.mode)
        self.headers = parse_headers(opts.headers)
        if self.method == "POST":
            self.headers.setdefault("Content-Type", opts.content_type)
        self.slots = asyncio.Semaphore(opts.publishers)
        self.sent = 0
        self.failed = 0

    async def handle(self, msg: Message) -> bool | None:
        if self.opts.sample < 1.0 and self.rng.random() > self.opts.sample:
            return None  # not sampled: FIN
        ok = True
        async with self.slots:
            for url in self.upstreams.pick(time.monotonic()):
                if self.method == "GET":
                    url = url.replace("%s", urllib.parse.quote_plus(msg.body.decode("utf-8", "surrogateescape")))
                    content = None
                else:
                    content = msg.body
                try:
                    await nsq_http.request(self.client, self.method, url, content=content, headers=self.headers)
                except NSQError as exc:
                    log.warning("%s %s: %s", self.method, url, exc)
                    self.upstreams.failure(url, time.monotonic())
                    self.failed += 1
                    ok = False
                    continue
                self.upstreams.success(url)
                self.sent += 1
                if self.opts.status_every and self.sent % self.opts.status_every == 0:
                    log.info("%d requests made, %d failed", self.sent, self.failed)
        return None if ok else False


async def main_async(opts: Options, stop: asyncio.Event) -> int:
    kwargs = common.consumer_options(opts.consumer_opts)
    async with nsq_http.make_client(opts.http_client_connect_timeout / SECOND,
                                    opts.http_client_request_timeout / SECOND) as client:
        fwd = Forwarder(opts, client, random.Random())
        await common.consume_until(stop, common.consumers_for([opts.topic], opts, lambda _: fwd.handle, kwargs))
    log.info("stopped; %d requests made, %d failed", fwd.sent, fwd.failed)
    return 0


def check(opts: Options) -> None:
    opts.check_sources()
    if not opts.topic:
        raise UsageError("--topic required")
    if not opts.get and not opts.post:
        raise UsageError("--get or --post required")
    if opts.get and opts.post:
        raise UsageError("use --get or --post not both")
    if opts.mode not in MODES:
        raise UsageError(f"invalid --mode {opts.mode!r}")
    if opts.mode == "multicast":
        logging.getLogger("pynsqd.tools").warning("multicast mode is deprecated in NSQ")
    if not 0.0 < opts.sample <= 1.0:
        raise UsageError("--sample must be between 0.0 and 1.0")
    if opts.publishers <= 0:
        raise UsageError("-n must be greater than 0")
    parse_headers(opts.headers)


TOOL = common.Tool(PROG, Options, "consume a topic and make an HTTP request per message", check, main_async)
run, main = TOOL.run, TOOL.main


if __name__ == "__main__":
    main()
