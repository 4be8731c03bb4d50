"""The utilities end to end: real nsqd nodes, real files, a real HTTP server, real signals."""

from __future__ import annotations

import gzip
import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.harness import Daemon, scaled, wait_for
from tests.support.foreign import channel_stats
from tests.test_discovery import lookupd_factory, registered_nsqd  # noqa: F401

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def tool(name: str, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(BIN / name), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, **kwargs)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()


def start(procs: list[subprocess.Popen[bytes]], name: str, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    p = tool(name, *args, **kwargs)
    procs.append(p)
    return p


def tcp(nsqd: Daemon) -> str:
    return f"--nsqd-tcp-address=127.0.0.1:{nsqd.tcp[1]}"


def stop(p: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> tuple[int, str, str]:
    p.send_signal(sig)
    out, err = p.communicate(timeout=scaled(30))
    return p.returncode, out.decode(), err.decode()


def drained(nsqd: Daemon, topic: str, channel: str, count: int) -> bool:
    try:
        ch = channel_stats(nsqd, topic, channel)
    except StopIteration:
        return False
    return bool(ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["message_count"] == count)


def pub_lines(nsqd: Daemon, topic: str, lines: list[bytes]) -> None:
    resp = httpx.post(f"{nsqd.http_url}/mpub", params={"topic": topic}, content=b"\n".join(lines), timeout=10)
    assert resp.text == "OK"


def read_output(directory: Path) -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(directory.iterdir()):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            lines.extend(fh.read().splitlines())
    return lines


@pytest.mark.parametrize("name", ["nsq_tail", "nsq_to_file", "nsq_to_http", "nsq_to_nsq", "to_nsq", "nsq_stat"])
def test_bad_flags_are_one_line_and_exit_1(name: str) -> None:
    for args in (["--bogus"], []):
        p = tool(name, *args)
        _, err = p.communicate(timeout=scaled(20))
        assert p.returncode == 1, (args, err)
        assert err.decode().count("\n") == 1 and err.decode().startswith(f"{name}: error: "), err
    p = tool(name, "--help")
    out, err = p.communicate(timeout=scaled(20))
    assert p.returncode == 0 and b"--topic" in out, err


def test_to_nsq_100k_lines_to_nsq_to_file_rotated_and_gzipped(nsqd: Daemon, tmp_path: Path,
                                                               procs: list[subprocess.Popen[bytes]]) -> None:
    lines = [b"line-%06d" % i for i in range(100_000)]
    pub = start(procs, "to_nsq", "--topic=archive", tcp(nsqd), stdin=subprocess.PIPE)
    _, err = pub.communicate(b"\n".join(lines) + b"\n", timeout=scaled(120))
    assert pub.returncode == 0, err
    finals = [line for line in err.decode().splitlines() if "published" in line and "so far" not in line]
    assert len(finals) == 1 and finals[0].endswith("published 100000 messages"), err  # the final count, once
    out, work = tmp_path / "out", tmp_path / "work"
    sink = start(procs, "nsq_to_file", "--topic=archive", tcp(nsqd), f"--output-dir={out}", f"--work-dir={work}",
                 "--gzip", "--rotate-size=300000", "--max-in-flight=1000")
    wait_for(lambda: drained(nsqd, "archive", "nsq_to_file", 100_000), timeout=120, interval=0.2, what="all FINed")
    # while it runs, the output dir holds only complete files (each one a whole gzip stream)
    running = sorted(out.iterdir())
    assert len(running) >= 2 and not any(p.name.startswith(".") for p in running)
    for path in running:
        gzip.decompress(path.read_bytes())
    code, _, err = stop(sink)
    assert code == 0, err
    assert list(work.iterdir()) == []
    files = sorted(out.iterdir())
    assert all(f.name.startswith("archive.") and f.name.endswith(".log.gz") for f in files)
    assert sorted(read_output(out)) == lines  # exactly those lines, each once


def test_nsq_to_file_rotates_by_time_and_finishes_on_sigint(nsqd: Daemon, tmp_path: Path,
                                                            procs: list[subprocess.Popen[bytes]]) -> None:
    out = tmp_path / "out"
    sink = start(procs, "nsq_to_file", "--topic=timed", tcp(nsqd), f"--output-dir={out}",
                 "--rotate-interval=500ms", "--filename-format=<TOPIC>-<PID><REV>.txt", "--skip-empty-files")
    wait_for(lambda: _clients(nsqd, "timed", "nsq_to_file") == 1, timeout=15, what="subscribed")
    pub_lines(nsqd, "timed", [b"a1", b"a2"])
    wait_for(lambda: len(_visible(out)) == 1, timeout=10, what="first file rotated")
    pub_lines(nsqd, "timed", [b"b1"])
    wait_for(lambda: drained(nsqd, "timed", "nsq_to_file", 3), what="FINed")
    code, _, err = stop(sink, signal.SIGINT)
    assert code == 0, err
    files = sorted(out.iterdir(), key=lambda p: p.stat().st_mtime)
    assert len(files) == 2 and files[0].name == f"timed-{sink.pid}.txt" and files[1].name == f"timed-{sink.pid}-1.txt"
    assert [f.read_bytes() for f in files] == [b"a1\na2\n", b"b1\n"]


def _visible(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if not p.name.startswith(".")] if directory.exists() else []


def _clients(nsqd: Daemon, topic: str, channel: str) -> int:
    try:
        return int(channel_stats(nsqd, topic, channel)["client_count"])
    except StopIteration:
        return 0


def test_nsq_tail_n_prints_n_and_gives_the_rest_back(nsqd: Daemon, procs: list[subprocess.Popen[bytes]]) -> None:
    pub_lines(nsqd, "tailed", [b"m%d" % i for i in range(20)])
    tail = start(procs, "nsq_tail", "--topic=tailed", "--channel=watch", tcp(nsqd), "-n", "5", "--print-topic")
    out, err = tail.communicate(timeout=scaled(30))
    assert tail.returncode == 0, err
    assert out.decode().splitlines() == [f"tailed | m{i}" for i in range(5)]
    wait_for(lambda: channel_stats(nsqd, "tailed", "watch")["in_flight_count"] == 0, what="nothing in flight")
    assert channel_stats(nsqd, "tailed", "watch")["depth"] == 15


def test_nsq_to_nsq_between_two_nodes(nsqd_factory: Callable[..., Daemon],
                                      procs: list[subprocess.Popen[bytes]]) -> None:
    a, b = nsqd_factory(), nsqd_factory()
    pub_lines(a, "src", [b'{"k": %d, "keep": "yes", "drop": 1}' % i for i in range(500)]
              + [b'{"k": "x", "keep": "no"}', b"not json"])
    httpx.post(f"{b.http_url}/channel/create", params={"topic": "dst", "channel": "check"})
    httpx.post(f"{b.http_url}/topic/create", params={"topic": "dst"})
    httpx.post(f"{b.http_url}/channel/create", params={"topic": "dst", "channel": "check"})
    relay = start(procs, "nsq_to_nsq", "--topic=src", tcp(a), f"--destination-nsqd-tcp-address=127.0.0.1:{b.tcp[1]}",
                  "--destination-topic=dst", "--require-json-field=keep", "--require-json-value=yes",
                  "--whitelist-json-field=k")
    wait_for(lambda: drained(a, "src", "nsq_to_nsq", 502), timeout=30, what="relayed")
    code, _, err = stop(relay)
    assert code == 0, err
    ch = channel_stats(b, "dst", "check")
    assert ch["depth"] == 500
    got = httpx.get(f"{b.http_url}/stats", params={"format": "json"}).json()
    assert next(t for t in got["topics"] if t["topic_name"] == "dst")["message_count"] == 500


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the forwarder's client expects
    seen: list[tuple[str, str, bytes]] = []
    fail_first: set[str] = set()
    lock = threading.Lock()

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.lock:
            key = self.path + body.decode()
            if self.path.startswith("/flaky") and key not in self.fail_first:
                self.fail_first.add(key)
                status = 500
            else:
                status = 200
                self.seen.append((self.command, self.path, body))
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def web() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Recorder", (_Recorder,), {"seen": [], "fail_first": set()})
    server_class = type("Server", (http.server.ThreadingHTTPServer,), {"request_queue_size": 256})
    server = server_class(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()
    thread.join()


def test_nsq_to_http_post_round_robin_with_retries(nsqd: Daemon, web: tuple[str, type[_Recorder]],
                                                   procs: list[subprocess.Popen[bytes]]) -> None:
    base, rec = web
    pub_lines(nsqd, "hooks", [b"m%d" % i for i in range(40)])
    fwd = start(procs, "nsq_to_http", "--topic=hooks", tcp(nsqd), f"--post={base}/a", f"--post={base}/flaky",
                "--mode=round-robin", "--header=X-Test: yes", "--consumer-opt=backoff_multiplier,10ms",
                "--consumer-opt=default_requeue_delay,0")
    wait_for(lambda: drained(nsqd, "hooks", "nsq_to_http", 40), timeout=30, what="all delivered")
    code, _, err = stop(fwd)
    assert code == 0, err
    bodies = sorted(b for _, _, b in rec.seen)
    assert sorted(set(bodies)) == sorted(b"m%d" % i for i in range(40))  # each delivered (retried if it failed)
    assert {p for _, p, _ in rec.seen} == {"/a", "/flaky"}
    assert channel_stats(nsqd, "hooks", "nsq_to_http")["requeue_count"] > 0  # the 500s were retried


def test_nsq_to_http_get_multicast(nsqd: Daemon, web: tuple[str, type[_Recorder]],
                                   procs: list[subprocess.Popen[bytes]]) -> None:
    base, rec = web
    pub_lines(nsqd, "gets", [b"a b", b"c&d"])
    fwd = start(procs, "nsq_to_http", "--topic=gets", tcp(nsqd), f"--get={base}/one?v=%s", f"--get={base}/two?v=%s",
                "--mode=multicast")
    wait_for(lambda: drained(nsqd, "gets", "nsq_to_http", 2), timeout=30, what="all delivered")
    code, _, err = stop(fwd)
    assert code == 0, err
    assert sorted(p for m, p, _ in rec.seen if m == "GET") == ["/one?v=a+b", "/one?v=c%26d", "/two?v=a+b",
                                                               "/two?v=c%26d"]


def test_nsq_stat_columns(nsqd_factory: Callable[..., Daemon]) -> None:
    nodes = [nsqd_factory(), nsqd_factory()]
    for i, node in enumerate(nodes):
        httpx.post(f"{node.http_url}/topic/create", params={"topic": "st"})
        httpx.post(f"{node.http_url}/channel/create", params={"topic": "st", "channel": "c"})
        pub_lines(node, "st", [b"x"] * (3 + i))
    args = [f"--nsqd-http-address=127.0.0.1:{n.http[1]}" for n in nodes]
    p = tool("nsq_stat", "--topic=st", "--channel=c", "--count=2", "--interval=100ms", *args)
    out, err = p.communicate(timeout=scaled(30))
    assert p.returncode == 0, err
    lines = out.decode().splitlines()
    # NSQ v1.3's nsq_stat, recorded: the header, then (from the second poll on) one line per poll
    assert lines[:2] == [
        "------rate------+----------------depth----------------+--------------metadata---------------",
        "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients"]
    assert lines[2] == lines[3] == \
        "      0       0 |       7       7       0     0     0 |       0       0            7       0"
    assert len(lines) == 4
    # as NSQ's, a channel no producer has ends it: one line, status 1
    p = tool("nsq_stat", "--topic=st", "--channel=nosuch", "--count=2", "--interval=100ms", *args)
    out, err = p.communicate(timeout=scaled(30))
    assert p.returncode == 1 and out == b""
    assert err.decode() == "nsq_stat: error: failed to find channel(nosuch) in stats metadata for topic(st)\n"


def test_to_nsq_rate_delimiter_and_sigterm(nsqd: Daemon, procs: list[subprocess.Popen[bytes]]) -> None:
    pub = start(procs, "to_nsq", "--topic=paced", tcp(nsqd), "--delimiter=,", "--rate=20", stdin=subprocess.PIPE)
    assert pub.stdin is not None
    pub.stdin.write(b"a,b,,c,")
    pub.stdin.flush()
    wait_for(lambda: _topic_count(nsqd, "paced") == 3, timeout=15, what="3 published")
    code, _, err = stop(pub)  # stdin still open: SIGTERM ends it cleanly
    assert code == 0, err
    assert "published 3 messages" in err


def _topic_count(nsqd: Daemon, topic: str) -> int:
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json"}, timeout=5).json()
    return next((int(t["message_count"]) for t in data["topics"] if t["topic_name"] == topic), 0)


def test_nsq_to_file_discovers_topics_through_lookupd(lookupd_factory: Callable[..., Daemon],  # noqa: F811
                                                      nsqd_factory: Callable[..., Daemon], tmp_path: Path,
                                                      procs: list[subprocess.Popen[bytes]]) -> None:
    lk = lookupd_factory()
    node = registered_nsqd(nsqd_factory, [lk])
    pub_lines(node, "logs_a", [b"a"])
    pub_lines(node, "other", [b"o"])
    out = tmp_path / "out"
    sink = start(procs, "nsq_to_file", f"--lookupd-http-address=127.0.0.1:{lk.http[1]}", "--topic-pattern=^logs_",
                 "--topic-refresh=200ms", f"--output-dir={out}", "--filename-format=<TOPIC><REV>.log",
                 "--consumer-opt=lookupd_poll_interval,200ms")
    wait_for(lambda: drained(node, "logs_a", "nsq_to_file", 1), timeout=15, what="logs_a archived")
    pub_lines(node, "logs_b", [b"b"])  # a topic that appears later is picked up
    wait_for(lambda: drained(node, "logs_b", "nsq_to_file", 1), timeout=15, what="logs_b archived")
    code, _, err = stop(sink)
    assert code == 0, err
    assert sorted(p.name for p in _visible(out)) == ["logs_a.log", "logs_b.log"]
    assert (out / "logs_a.log").read_bytes() == b"a\n" and (out / "logs_b.log").read_bytes() == b"b\n"
