"""The scenarios of ``bench_nsqd.py`` beyond NSQ's bench.sh: what users meet besides throughput.

  tls       MPUB of 200 over TLS (2 connections, ``--runfor`` s), then 2 TLS consumers drain it
  snappy    2 consumers negotiating snappy drain a preloaded backlog (JSON-like text bodies)
  deflate   the same with deflate (level 6)
  idle      10,000 connections (magic, IDENTIFY, SUB to one channel, RDY 1) opened at once:
            seconds until every SUB is answered, RSS of the node then, its CPU over 10 s idle
  mib       1 MiB messages: PUB from 2 connections (at most ``MIB_COUNT`` messages), then 2
            consumers drain them: MB/s each way
  deferred  1,000,000 DPUB of 60 s (2 pipelined connections): publish rate, RSS, and CPU (% of
            a core) over 10 s while they wait
  backlog   5,000,000 messages on disk (nodes started with ``--mem-queue-size=0``, MPUB of
            200 from 2 connections), then drained by 2 consumers: msgs/s and CPU µs a message
  latency   publish-to-deliver p50/p99/p99.9 (the publisher's clock in each body, read by the
            consumer) at half of the peak rate, the peak measured first with the same load
            unpaced (MPUB of 20, 2 publishers, 2 consumers)

Load runs in spawned processes as in ``nsqd_scenarios.py``, the same for both nodes. Every
scenario is its own group: fresh nodes, started with its flags (``flags``: TLS needs
``--tls-cert``/``--tls-key``, made for the run, and HTTPS on a free port).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import resource
import selectors
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from bench.bench_tcp import _connect, _read_response, answer_frames
from bench.common import negotiate
from bench.nsqd_scenarios import Figures, Target, _percentiles, _run
from pynsqd.wire.commands import encode_dpub, encode_identify, encode_mpub, encode_pub, encode_rdy, encode_sub

_HDR = struct.Struct(">ii")
_STAMP = struct.Struct(">q")
BATCH = 200
IDLE_CONNECTIONS = 10_000
IDLE_SECONDS = 10.0
MIB_COUNT = 1000  # 1 MiB messages published at most (both nodes hold theirs until the group ends)
DEFERRED = 1_000_000
DEFER_MS = 60_000
BACKLOG = 5_000_000
PREFILL = 400_000  # messages the compressed consumers drain


def text_body(size: int) -> bytes:
    """A JSON-like body that compresses as real events do."""
    text = json.dumps({"user": "user-977", "event": "page_view", "path": "/products/item",
                       "ua": "Mozilla/5.0 (X11; Linux x86_64)", "pad": ""})
    return (text * (size // len(text) + 1))[:size].encode()


# --- load processes ------------------------------------------------------------------------

def drainer(addr: tuple[str, int], topic: str, features: dict[str, Any], ca: str, count: int, start: float,
            out: mp.Queue) -> None:  # type: ignore[type-arg]
    """SUB + RDY 2500 with ``features``, FIN every message, until ``count`` arrived or the
    channel has been dry for 1 s (10 s before the first message). Puts (messages, first,
    last, [])."""
    sock, codec = negotiate(addr, features, ca)
    send = (lambda b: sock.sendall(codec.encode(b))) if codec else sock.sendall
    send(encode_sub(topic, "ch"))
    time.sleep(max(0.0, start - time.time()))
    send(encode_rdy(2500))
    buf = bytearray()
    got = 0
    first = last = 0.0
    sock.settimeout(10.0)
    while got < count:
        try:
            raw = sock.recv(1 << 20)
        except TimeoutError:
            break
        if not raw:
            break
        buf += b"".join(codec.decode(raw)) if codec else raw
        answers, stamps = answer_frames(buf)
        if stamps:
            last = time.time()
            if not first:
                first = last
                sock.settimeout(1.0)
            got += len(stamps)
        if answers:
            send(b"".join(answers))
    out.put((got, first, last, []))
    sock.close()


def filler(addr: tuple[str, int], topic: str, features: dict[str, Any], ca: str, body: bytes, batch: int,
           count: int, runfor: float, start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """MPUB of ``batch`` (PUB for 1) until ``count`` messages or ``runfor`` s. Puts
    (messages, first send, last answer, [])."""
    sock, _ = negotiate(addr, features, ca)
    frame = encode_mpub(topic, [body] * batch) if batch > 1 else encode_pub(topic, body)
    time.sleep(max(0.0, start - time.time()))
    began = time.time()
    end = time.monotonic() + runfor
    sent = 0
    while sent < count and time.monotonic() < end:
        sock.sendall(frame)
        _read_response(sock)
        sent += batch
    out.put((sent, began, time.time(), []))
    sock.close()


def deferrer(addr: tuple[str, int], topic: str, body: bytes, count: int, start: float,
             out: mp.Queue) -> None:  # type: ignore[type-arg]
    """``count`` DPUB of ``DEFER_MS``, up to 256 unanswered at a time."""
    sock = _connect(addr)
    frame = encode_dpub(topic, DEFER_MS, body)
    time.sleep(max(0.0, start - time.time()))
    began = time.time()
    window = 256
    sent = answered = 0
    buf = bytearray()
    while answered < count:
        if sent < count and sent - answered < window:
            n = min(window - (sent - answered), count - sent)
            sock.sendall(frame * n)
            sent += n
        buf += sock.recv(1 << 16)
        while len(buf) >= 8 and len(buf) >= 4 + _HDR.unpack_from(buf)[0]:
            size, kind = _HDR.unpack_from(buf)
            if kind == 1:
                raise SystemExit(f"the node answered {bytes(buf[8:4 + size])!r}")
            del buf[:4 + size]
            answered += 1
    out.put((answered, began, time.time(), []))
    sock.close()


def stamper(addr: tuple[str, int], topic: str, size: int, rate: float, runfor: float, start: float,
            out: mp.Queue) -> None:  # type: ignore[type-arg]
    """MPUB of 20 whose bodies start with the send time (``time.time_ns``), paced to ``rate``
    msgs/s (0: as fast as answered) for ``runfor`` s."""
    sock = _connect(addr)
    batch = 20
    pad = b"a" * (size - 8)
    time.sleep(max(0.0, start - time.time()))
    began = time.time()
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < runfor:
        if rate:
            delay = t0 + sent / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        body = _STAMP.pack(time.time_ns()) + pad
        sock.sendall(encode_mpub(topic, [body] * batch))
        _read_response(sock)
        sent += batch
    out.put((sent, began, time.time(), []))
    sock.close()


def stamp_reader(addr: tuple[str, int], topic: str, runfor: float, start: float,
                 out: mp.Queue) -> None:  # type: ignore[type-arg]
    """SUB + RDY 2500, FIN each, for ``runfor`` s: every message's delay since its body's send
    time. Puts (messages, first, last, delays in seconds)."""
    sock = _connect(addr)
    sock.sendall(encode_sub(topic, "ch"))
    _read_response(sock)
    time.sleep(max(0.0, start - time.time()))
    sock.sendall(encode_rdy(2500))
    sock.settimeout(0.5)
    buf = bytearray()
    delays: list[float] = []
    end = time.monotonic() + runfor
    first = last = 0.0
    while time.monotonic() < end:
        try:
            raw = sock.recv(1 << 20)
        except TimeoutError:
            continue
        now = time.time_ns()
        buf += raw
        pos = 0
        fins = []
        while len(buf) - pos >= 8:
            size, kind = _HDR.unpack_from(buf, pos)
            if len(buf) - pos - 4 < size:
                break
            if kind == 2:
                fins.append(b"FIN " + bytes(buf[pos + 18:pos + 34]) + b"\n")
                delays.append((now - _STAMP.unpack_from(buf, pos + 34)[0]) / 1e9)
            elif buf[pos + 8:pos + 4 + size] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos += 4 + size
        del buf[:pos]
        if fins:
            last = time.time()
            first = first or last
            sock.sendall(b"".join(fins))
    out.put((len(delays), first, last, delays))
    sock.close()


def idler(addr: tuple[str, int], topic: str, count: int, hold: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """Open ``count`` connections at once (magic, IDENTIFY, SUB, RDY 1), at most 1,000 of them
    not yet answered; put the seconds until every SUB is answered, hold them ``hold`` s."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 1024)), hard))
    hello = b"  V2" + encode_identify(b'{"client_id":"idle","heartbeat_interval":60000}') + encode_sub(topic, "ch")
    sel = selectors.DefaultSelector()
    pending: dict[socket.socket, bytearray] = {}
    held: list[socket.socket] = []
    t0 = time.monotonic()
    opened = 0
    while opened < count or pending:
        while opened < count and len(pending) < 1000:
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(addr)
            sel.register(sock, selectors.EVENT_WRITE)
            pending[sock] = bytearray()
            opened += 1
        for key, events in sel.select(5.0):
            sock = key.fileobj  # type: ignore[assignment]
            if events & selectors.EVENT_WRITE:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise SystemExit(f"connect failed: {os.strerror(err)}")
                sock.sendall(hello)
                sel.modify(sock, selectors.EVENT_READ)
                continue
            data = sock.recv(4096)
            if not data:
                raise SystemExit("the node closed an idle connection")
            buf = pending[sock]
            buf += data
            if buf.count(b"OK") >= 2:  # IDENTIFY's and SUB's answers
                sel.unregister(sock)
                del pending[sock]
                sock.sendall(encode_rdy(1))
                held.append(sock)
    out.put(time.monotonic() - t0)
    time.sleep(hold)
    for sock in held:
        sock.close()


# --- scenarios -------------------------------------------------------------------------------

def _flow(t: Target, target: Callable[..., None], per_proc: list[tuple[Any, ...]], size: int) -> Figures:
    results, cpu = _run(t, target, per_proc)
    count = sum(r[0] for r in results)
    firsts = [r[1] for r in results if r[1]]
    span = max(r[2] for r in results) - min(firsts) if firsts else math.inf
    t.meter.rss()
    return {"msgs_s": count / max(span, 1e-9), "mb_s": count * size / max(span, 1e-9) / 2**20,
            "cpu_us_msg": cpu / count * 1e6 if count else math.nan, "count": count}


def _fill(t: Target, o: Any, topic: str, features: dict[str, Any], body: bytes, batch: int, count: int,
          runfor: float) -> Figures:
    """Publish ``count`` messages (or for ``runfor`` s) from 2 connections negotiating ``features``."""
    return _flow(t, filler, [(t.tcp, topic, features, o.certs["ca"], body, batch, count // 2, runfor)] * 2,
                 len(body))


def _drain(t: Target, o: Any, topic: str, features: dict[str, Any], stored: int, size: int) -> Figures:
    """Drain ``stored`` messages with 2 consumers negotiating ``features`` (each stops once
    the channel is dry)."""
    t.settle()
    sub = _flow(t, drainer, [(t.tcp, topic, features, o.certs["ca"], stored)] * 2, size)
    if sub["count"] < stored:
        print(f"note: {stored - int(sub['count']):,} of {stored:,} messages not drained", flush=True)
    return sub


def tls(t: Target, o: Any) -> Figures:
    topic, features = t.topics("tls")[0], {"tls_v1": True}
    pub = _fill(t, o, topic, features, b"a" * o.size, BATCH, 1 << 40, o.runfor)
    sub = _drain(t, o, topic, features, int(pub["count"]), o.size)
    return {"pub_msgs_s": pub["msgs_s"], "pub_cpu_us_msg": pub["cpu_us_msg"],
            "sub_msgs_s": sub["msgs_s"], "sub_cpu_us_msg": sub["cpu_us_msg"]}


def _compressed(t: Target, o: Any, name: str) -> Figures:
    topic = t.topics(name)[0]
    pub = _fill(t, o, topic, {}, text_body(o.size), BATCH, PREFILL, 600.0)
    sub = _drain(t, o, topic, {name: True}, int(pub["count"]), o.size)
    return {"msgs_s": sub["msgs_s"], "cpu_us_msg": sub["cpu_us_msg"]}


def snappy(t: Target, o: Any) -> Figures:
    return _compressed(t, o, "snappy")


def deflate(t: Target, o: Any) -> Figures:
    return _compressed(t, o, "deflate")


def idle(t: Target, o: Any) -> Figures:
    topic = t.topics("idle")[0]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    t.meter.peak_rss = 0
    rss0 = t.meter.rss()
    proc = ctx.Process(target=idler, args=(t.tcp, topic, IDLE_CONNECTIONS, IDLE_SECONDS + 5.0, q))
    proc.start()
    took = q.get(timeout=600)
    time.sleep(1.0)
    rss = t.meter.rss()
    cpu0 = t.meter.cpu()
    time.sleep(IDLE_SECONDS)
    cpu = t.meter.cpu() - cpu0
    proc.join()
    return {"accept_s": took, "rss_mb": rss / 2**20, "rss_per_conn_kb": (rss - rss0) / IDLE_CONNECTIONS / 1024,
            "idle_cpu_pct": cpu / IDLE_SECONDS * 100}


def mib(t: Target, o: Any) -> Figures:
    topic = t.topics("mib")[0]
    pub = _fill(t, o, topic, {}, b"m" * 2**20, 1, MIB_COUNT, o.runfor)
    sub = _drain(t, o, topic, {}, int(pub["count"]), 2**20)
    return {"pub_mb_s": pub["mb_s"], "pub_cpu_ms_mb": pub["cpu_us_msg"] / 1e3,
            "sub_mb_s": sub["mb_s"], "sub_cpu_ms_mb": sub["cpu_us_msg"] / 1e3, "peak_rss_mb": t.meter.peak_rss / 2**20}


def deferred(t: Target, o: Any) -> Figures:
    topic = t.topics("deferred")[0]
    pub = _flow(t, deferrer, [(t.tcp, topic, b"d" * o.size, DEFERRED // 2)] * 2, o.size)
    rss = t.meter.rss()
    cpu0 = t.meter.cpu()
    time.sleep(IDLE_SECONDS)
    cpu = t.meter.cpu() - cpu0
    return {"dpub_msgs_s": pub["msgs_s"], "rss_mb": rss / 2**20, "waiting_cpu_pct": cpu / IDLE_SECONDS * 100,
            "rss_after_mb": t.meter.rss() / 2**20}


def backlog(t: Target, o: Any) -> Figures:
    topic = t.topics("backlog")[0]
    pub = _fill(t, o, topic, {}, b"b" * o.size, BATCH, BACKLOG, 3600.0)
    sub = _drain(t, o, topic, {}, int(pub["count"]), o.size)
    return {"fill_msgs_s": pub["msgs_s"], "drain_msgs_s": sub["msgs_s"], "drain_cpu_us_msg": sub["cpu_us_msg"],
            "peak_rss_mb": t.meter.peak_rss / 2**20}


def _delivered(results: list[Any]) -> tuple[float, list[float], int]:
    """msgs/s delivered to the readers (first to last), their delays, how many."""
    reads = [r for r in results if isinstance(r[3], list) and r[3]]
    count = sum(r[0] for r in reads)
    span = max((r[2] for r in reads), default=0.0) - min((r[1] for r in reads), default=0.0)
    return (count / span if span > 0 else math.nan), [d for r in reads for d in r[3]], count


def latency(t: Target, o: Any) -> Figures:
    topic = t.topics("latency")[0]
    peak_run = 3.0
    results, _ = _run(t, _latency_pair, [("pub", t.tcp, topic, o.size, 0, peak_run)] * 2
                      + [("sub", t.tcp, topic, peak_run + 1.0)] * 2)
    peak = _delivered(results)[0]
    t.settle()
    rate = peak / 2
    results, cpu = _run(t, _latency_pair, [("pub", t.tcp, topic, o.size, rate / 2, o.runfor)] * 2
                        + [("sub", t.tcp, topic, o.runfor + 1.0)] * 2)
    got, delays, count = _delivered(results)
    return {"peak_msgs_s": peak, "msgs_s": got, "cpu_us_msg": cpu / count * 1e6 if count else math.nan,
            **_percentiles(delays)}


def _latency_pair(role: str, *args: Any) -> None:
    (stamper if role == "pub" else stamp_reader)(*args)


SCENARIOS: dict[str, tuple[str, Callable[[Target, Any], Figures]]] = {
    "tls": ("MPUB of 200 over TLS, then TLS consumers", tls),
    "snappy": ("consumers negotiating snappy", snappy),
    "deflate": ("consumers negotiating deflate", deflate),
    "idle": (f"{IDLE_CONNECTIONS:,} idle connections: time to accept, RSS, CPU", idle),
    "mib": ("1 MiB messages, MB/s in and out", mib),
    "deferred": (f"{DEFERRED:,} DPUB of {DEFER_MS // 1000} s: RSS and CPU while they wait", deferred),
    "backlog": (f"draining {BACKLOG:,} messages from disk", backlog),
    "latency": ("publish-to-deliver p50/p99/p99.9 at half of the peak rate", latency),
}


def flags(name: str, certs: dict[str, str], mem_queue_size: int) -> list[str]:
    """The flags of the nodes for scenario ``name`` (each is its own group)."""
    if name == "tls":
        return [f"--mem-queue-size={mem_queue_size}", f"--tls-cert={certs['cert']}", f"--tls-key={certs['key']}",
                "--https-address=127.0.0.1:0"]
    return [f"--mem-queue-size={0 if name == 'backlog' else mem_queue_size}"]
