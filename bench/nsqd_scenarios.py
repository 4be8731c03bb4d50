"""The scenarios ``bench_nsqd.py`` runs against one node, and the TCP publish load they share.

Every scenario takes a ``Target`` (the node's addresses, the meter of its process tree, what
earlier scenarios of the group left on it) and the run's options, and returns its figures:
throughput, server CPU µs a message (the whole process tree), peak RSS of the tree, and
round-trip percentiles where a request carries one message. Load runs in separate
processes (spawned, pre-encoded frames, one outstanding request per connection), so that it
costs the shared cores as little as Python allows.
"""

from __future__ import annotations

import http.client
import math
import multiprocessing as mp
import select
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bench import nsq_tools, wrk
from bench.bench_http import worker as http_worker
from bench.bench_shards import consumers
from bench.bench_tcp import _HDR, _connect, create_channels
from bench.common import Meter, gather_results
from pynsqd.wire.commands import encode_mpub, encode_pub

BATCH = 200  # messages per MPUB
MANY = 32  # topics of the many-topic scenarios
HTTP_CONNECTIONS = 50
LOAD_PROCS = 2  # load processes (or wrk threads) per scenario

Figures = dict[str, float]


@dataclass
class Target:
    """One node under load: where it listens, its process tree, and what is on it."""

    tcp: tuple[str, int]
    http: tuple[str, int]
    meter: Meter
    prefix: str  # topic names start with it (unique per node and run)
    backlog: dict[tuple[str, ...], int] = field(default_factory=dict)  # messages left on these topics
    created: list[str] = field(default_factory=list)  # topics made, in order

    def topics(self, *names: str) -> list[str]:
        """Full topic names for ``names``, each with channel ``ch`` existing on the node."""
        full = [f"{self.prefix}-{n}" for n in names]
        new = [t for t in full if t not in self.created]
        create_channels(self.tcp, new)
        self.created.extend(new)
        return full

    def settle(self, timeout: float = 20.0) -> None:
        """Wait (up to ``timeout`` s) until the node is idle: under 6% of a CPU over 0.5 s, so
        that no work left from starting or from the last scenario counts in the next one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            cpu = self.meter.cpu()
            time.sleep(0.5)
            if self.meter.cpu() - cpu < 0.03:
                return
        print(f"note: the node at {self.tcp[0]}:{self.tcp[1]} was still busy after {timeout:g} s", flush=True)


def publisher(addr: tuple[str, int], frames: list[bytes], batch: int, runfor: float, start: float,
              out: mp.Queue) -> None:
    """One connection per frame under one epoll, each sending its frame again as soon as the
    last one is answered, for ``runfor`` s from ``start``. Puts (messages, first send, last
    answer, the round-trip seconds of every answer)."""
    socks = {}
    for frame in frames:
        sock = _connect(addr)
        socks[sock.fileno()] = (sock, frame, bytearray())
    poll = select.epoll()
    for fd in socks:
        poll.register(fd, select.EPOLLIN)
    sent = dict.fromkeys(socks, 0.0)
    rtts: list[float] = []
    count = 0
    time.sleep(max(0.0, start - time.time()))
    began, end = time.time(), time.monotonic() + runfor
    for fd, (sock, frame, _) in socks.items():
        sent[fd] = time.perf_counter()
        sock.sendall(frame)
    live = len(socks)
    while live:
        for fd, _ in poll.poll(1.0):
            sock, frame, buf = socks[fd]
            data = sock.recv(65536)
            if not data:
                raise SystemExit("the node closed a publishing connection")
            buf += data
            while len(buf) >= 8 and len(buf) >= 4 + _HDR.unpack_from(buf)[0]:
                size, kind = _HDR.unpack_from(buf)
                body = bytes(buf[8:4 + size])
                del buf[:4 + size]
                if kind == 1:
                    raise SystemExit(f"the node answered {body!r}")
                if body == b"_heartbeat_":
                    sock.sendall(b"NOP\n")
                    continue
                rtts.append(time.perf_counter() - sent[fd])
                count += batch
                if time.monotonic() < end:
                    sent[fd] = time.perf_counter()
                    sock.sendall(frame)
                else:
                    poll.unregister(fd)
                    live -= 1
    out.put((count, began, time.time(), rtts))
    for sock, _, _ in socks.values():
        sock.close()


def _percentiles(seconds: list[float]) -> Figures:
    seconds.sort()
    return {f"p{p:g}_ms": seconds[min(len(seconds) - 1, int(len(seconds) * p / 100))] * 1e3
            for p in (50, 99, 99.9)} if seconds else {}


def _run(t: Target, target: Callable[..., None], per_proc: list[tuple[Any, ...]]) -> tuple[list[Any], float]:
    """Spawn one load process per argument tuple (each gets ``start`` and the queue appended),
    sample RSS meanwhile; returns their results and the server CPU seconds spent."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 1.0  # spawned processes import for a while
    procs = [ctx.Process(target=target, args=(*args, start, q)) for args in per_proc]
    t.meter.peak_rss = 0
    cpu0 = t.meter.cpu()
    results = gather_results(procs, q, t.meter.rss)
    return results, t.meter.cpu() - cpu0


def _tcp_figures(t: Target, results: list[Any], cpu: float) -> tuple[Figures, int]:
    count = sum(r[0] for r in results)
    firsts = [r[1] for r in results if r[1]]  # a consumer that got nothing has no first message
    span = max(r[2] for r in results) - min(firsts) if firsts else math.inf
    t.meter.rss()
    return {"msgs_s": count / max(span, 1e-9), "cpu_us_msg": cpu / count * 1e6 if count else math.nan,
            "peak_rss_mb": t.meter.peak_rss / 2**20}, count


def _nsq_tool(t: Target, o: Any, tool: str, topics: list[str], batch: int = 0) -> tuple[Figures, int]:
    """Load from NSQ's ``tool`` (``nsq_tools.py``) instead of the Python load processes."""
    t.meter.peak_rss = 0
    cpu0 = t.meter.cpu()
    rate = nsq_tools.run(o.nsq_tools, tool, t.tcp, topics, o.runfor, o.size, batch, t.meter.rss)
    cpu = t.meter.cpu() - cpu0
    count = round(rate * o.runfor)
    t.meter.rss()
    return {"msgs_s": rate, "cpu_us_msg": cpu / count * 1e6 if count else math.nan,
            "peak_rss_mb": t.meter.peak_rss / 2**20}, count


def _publish(t: Target, o: Any, topics: list[str], batch: int) -> tuple[Figures, list[float]]:
    """Publish to ``topics`` (one connection each, spread over the load processes), or to one
    topic from ``LOAD_PROCS`` connections; MPUB of ``batch`` or, for 1, PUB. With
    ``--nsq-tools``: NSQ's bench_writer (MPUB of ``batch``, also of 1)."""
    if o.nsq_tools:
        figures, count = _nsq_tool(t, o, "bench_writer", topics, batch)
        t.backlog[tuple(topics)] = t.backlog.get(tuple(topics), 0) + count
        return figures, []
    body = b"a" * o.size
    frames = [encode_mpub(tp, [body] * batch) if batch > 1 else encode_pub(tp, body) for tp in topics]
    if len(frames) == 1:
        frames *= LOAD_PROCS
    per = len(frames) // LOAD_PROCS
    results, cpu = _run(t, publisher, [(t.tcp, frames[i * per:(i + 1) * per], batch, o.runfor)
                                       for i in range(LOAD_PROCS)])
    figures, count = _tcp_figures(t, results, cpu)
    t.backlog[tuple(topics)] = t.backlog.get(tuple(topics), 0) + count
    return figures, [x for r in results for x in r[3]]


def _consume(t: Target, o: Any, topics: list[str]) -> Figures:
    """Drain ``topics`` (SUB, RDY 2500, FIN each; one connection a topic, or ``LOAD_PROCS`` on
    one topic) for ``runfor`` s at most; what the publish scenario left, filled first if none."""
    if not t.backlog.get(tuple(topics)):
        _publish(t, o, topics, BATCH)
    total = t.backlog[tuple(topics)]
    if o.nsq_tools:  # bench_reader runs ``runfor`` whatever is left: a drained backlog lowers its rate
        figures, count = _nsq_tool(t, o, "bench_reader", topics)
        t.backlog[tuple(topics)] = max(0, total - count)
        if count >= 0.98 * total:
            print(f"note: bench_reader drained the backlog ({total:,} messages): its rate is low", flush=True)
        return figures
    groups = [topics] * LOAD_PROCS if len(topics) == 1 else [topics[i::LOAD_PROCS] for i in range(LOAD_PROCS)]
    results, cpu = _run(t, consumers, [(t.tcp, g, o.runfor, total) for g in groups])
    figures, count = _tcp_figures(t, results, cpu)
    t.backlog[tuple(topics)] = total - count
    if count < total and (not count or count / figures["msgs_s"] < o.runfor - 1):
        print(f"note: delivery stopped with {total - count:,} of {total:,} messages left", flush=True)
    return figures


def mpub(t: Target, o: Any) -> Figures:
    return _publish(t, o, t.topics("one"), BATCH)[0]


def sub(t: Target, o: Any) -> Figures:
    return _consume(t, o, t.topics("one"))


def pub(t: Target, o: Any) -> Figures:
    figures, rtts = _publish(t, o, t.topics("one"), 1)
    return {**figures, **_percentiles(rtts)}


def mpub32(t: Target, o: Any) -> Figures:
    return _publish(t, o, t.topics(*(f"many{i:02d}" for i in range(MANY))), BATCH)[0]


def sub32(t: Target, o: Any) -> Figures:
    return _consume(t, o, t.topics(*(f"many{i:02d}" for i in range(MANY))))


def http_pub(t: Target, o: Any) -> Figures:
    """POST /pub, one message a request, ``HTTP_CONNECTIONS`` keep-alive connections from
    ``LOAD_PROCS`` wrk threads or Python load processes."""
    topic = t.topics("http")[0]
    body = b"a" * o.size
    t.meter.peak_rss = 0
    if o.loadgen == "wrk":
        url = f"http://{t.http[0]}:{t.http[1]}/pub?topic={topic}"
        cpu0 = t.meter.cpu()
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(wrk.run, url, body, HTTP_CONNECTIONS, LOAD_PROCS, o.runfor)
            while not wait([running], 0.2).done:
                t.meter.rss()
        cpu, r = t.meter.cpu() - cpu0, running.result()
        requests, seconds = r.requests, r.seconds
        lat = {"p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "p99.9_ms": r.p999_ms}
    else:
        request = b"POST /pub?topic=%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
            topic.encode(), len(body), body)
        per = HTTP_CONNECTIONS // LOAD_PROCS
        results, cpu = _run(t, partial(http_worker, sample_every=1), [(t.http[1], request, per, o.runfor)] * LOAD_PROCS)
        requests, seconds = sum(r[0] for r in results), o.runfor
        lat = _percentiles([x for r in results for x in r[1]])
    t.meter.rss()
    return {"msgs_s": requests / seconds, "cpu_us_msg": cpu / max(requests, 1) * 1e6,
            "peak_rss_mb": t.meter.peak_rss / 2**20, **lat}


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> int:
    conn.request(method, path, body)
    resp = conn.getresponse()
    answer = resp.read()
    if resp.status not in (200, 404):
        raise SystemExit(f"{method} {path}: {resp.status} {answer[:200]!r}")
    return resp.status


def _answer_ms(conn: http.client.HTTPConnection, path: str) -> float:
    """Median of 5 round trips of GET ``path`` in ms (NaN where the node has no such route)."""
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        if _request(conn, "GET", path) != 200:
            return float("nan")
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def topics(t: Target, o: Any) -> Figures:
    """Create ``o.topics`` topics, each by its first /mpub of 10 messages then /channel/create
    (one keep-alive connection); then time /metrics and /stats?format=json."""
    conn = http.client.HTTPConnection(*t.http, timeout=300)
    body = b"\n".join([b"a" * o.size] * 10)
    names = [f"{t.prefix}-t{i:05d}" for i in range(o.topics)]
    t.meter.peak_rss = 0
    cpu0, t0 = t.meter.cpu(), time.perf_counter()
    for i, name in enumerate(names):
        _request(conn, "POST", f"/mpub?topic={name}", body)
        _request(conn, "POST", f"/channel/create?topic={name}&channel=ch")
        t.created.append(name)
        if i % 50 == 0:
            t.meter.rss()
    took, cpu = time.perf_counter() - t0, t.meter.cpu() - cpu0
    figures = {"create_s": took, "cpu_ms_topic": cpu / max(o.topics, 1) * 1e3,
               "metrics_ms": _answer_ms(conn, "/metrics"), "stats_ms": _answer_ms(conn, "/stats?format=json"),
               "rss_mb": t.meter.rss() / 2**20, "peak_rss_mb": t.meter.peak_rss / 2**20}
    conn.close()
    return figures


# name -> (what it measures, the function); scenarios of a group share a fresh node per side
SCENARIOS: dict[str, tuple[str, Callable[[Target, Any], Figures]]] = {
    "mpub": ("one topic, MPUB of 200, 2 connections", mpub),
    "sub": ("one topic, consume (RDY 2500, FIN each), 2 connections", sub),
    "pub": ("one topic, PUB one message a round trip, 2 connections", pub),
    "mpub32": ("32 topics, MPUB of 200, one connection each", mpub32),
    "sub32": ("32 topics, consume, one connection each", sub32),
    "http": ("HTTP POST /pub, one message a request, 2 x 25 connections", http_pub),
    "topics": ("create N topics by /mpub + /channel/create; /metrics, /stats", topics),
}
GROUPS = [("mpub", "sub", "pub"), ("mpub32", "sub32"), ("http",), ("topics",)]
