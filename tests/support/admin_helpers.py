"""A real cluster for the nsqadmin tests: 2 nsqlookupd, 2 nsqd registered with both, and
nsqadmin daemons pointed at them; plus a small HTTP server that records notifications."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from testbed.harness import Daemon, remove_segments, wait_for


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that does not log every request to stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LocalServer:
    """A threaded HTTP server on a free loopback port, serving ``handler`` until ``close``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Notifications(LocalServer):
    """An HTTP server on a free port that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(Handler)
        self.url += "/notify"

    def wait(self, action: str, topic: str, channel: str = "") -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((b for b in self.bodies if b["action"] == action and b["topic"] == topic
                         and b.get("channel", "") == channel), None)
        return dict(wait_for(found, 5, what=f"notification {action} {topic} {channel}"))


def free_port() -> int:
    """A port nothing listens on (bound, then closed) — an unreachable node."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """2 lookupds + 2 nsqds; ``admin(...)`` starts nsqadmin daemons against them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.daemons: list[Daemon] = []
        self.http = httpx.Client(timeout=10)
        self.lookupds: list[Daemon] = []
        self.nsqds: list[Daemon] = []

    def boot(self) -> None:
        tmp = self.tmp
        self.lookupds = [self._start("pynsqd.lookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                                        "--broadcast-address=127.0.0.1"]) for _ in range(2)]
        tcp = [f"--lookupd-tcp-address={d.tcp[0]}:{d.tcp[1]}" for d in self.lookupds]
        for i in range(2):
            path = tmp / f"nsqd{i}"
            path.mkdir(parents=True, exist_ok=True)
            self.nsqds.append(self._start("pynsqd.supervisor", [
                "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={path}",
                "--broadcast-address=127.0.0.1", *tcp]))
        for lookupd in self.lookupds:
            wait_for(lambda lookupd=lookupd: len(self.get(lookupd, "/nodes")["producers"]) == 2, 10,
                     what="both nsqds registered")

    def _start(self, module: str, args: list[str], listeners: tuple[str, ...] = ("TCP", "HTTP")) -> Daemon:
        daemon = Daemon(module, args, listeners=listeners)
        self.daemons.append(daemon)
        return daemon.start()

    def admin(self, *args: str, lookupds: list[str] | None = None) -> Daemon:
        upstream = lookupds if lookupds is not None else [addr(d) for d in self.lookupds]
        flags = [f"--lookupd-http-address={a}" for a in upstream] if not any(
            a.startswith("--nsqd-http-address") for a in args) else []
        return self._start("pynsqd.admin", ["--http-address=127.0.0.1:0", "--stats-sample-interval=200ms",
                                            *flags, *args], listeners=("HTTP",))

    def get(self, daemon: Daemon, path: str, **params: Any) -> Any:
        response = self.http.get(daemon.http_url + path, params=params)
        response.raise_for_status()
        return response.json()

    def post(self, daemon: Daemon, path: str, body: bytes = b"", **params: Any) -> httpx.Response:
        return self.http.post(daemon.http_url + path, params=params, content=body)

    def stats(self, nsqd: Daemon, topic: str | None = None) -> dict[str, Any]:
        params = {"format": "json"} | ({"topic": topic} if topic else {})
        return dict(self.get(nsqd, "/stats", **params))

    def topic_stats(self, nsqd: Daemon, topic: str) -> dict[str, Any] | None:
        return next((t for t in self.stats(nsqd, topic)["topics"] or [] if t["topic_name"] == topic), None)

    def channel_stats(self, nsqd: Daemon, topic: str, channel: str) -> dict[str, Any] | None:
        t = self.topic_stats(nsqd, topic)
        return next((c for c in t["channels"] if c["channel_name"] == channel), None) if t else None

    def publish(self, nsqd: Daemon, topic: str, count: int) -> None:
        body = b"\n".join(b"m%d" % i for i in range(count))
        assert self.post(nsqd, "/mpub", body, topic=topic).status_code == 200

    def seed(self, topic: str, channels: tuple[str, ...], counts: tuple[int, int]) -> None:
        """``topic`` on both nsqds with ``channels``, then ``counts`` messages published to each."""
        for nsqd, count in zip(self.nsqds, counts):
            assert self.post(nsqd, "/topic/create", topic=topic).status_code == 200
            for channel in channels:
                assert self.post(nsqd, "/channel/create", topic=topic, channel=channel).status_code == 200
            self.publish(nsqd, topic, count)
        for lookupd in self.lookupds:
            wait_for(lambda lookupd=lookupd: self._registered(lookupd, topic, channels), 10,
                     what=f"{topic} registered with lookupd")

    def _registered(self, lookupd: Daemon, topic: str, channels: tuple[str, ...]) -> bool:
        response = self.http.get(lookupd.http_url + "/lookup", params={"topic": topic})
        if response.status_code != 200:
            return False
        data = response.json()
        return len(data["producers"]) == 2 and set(channels) <= set(data["channels"])

    def stop(self) -> None:
        self.http.close()
        for daemon in reversed(self.daemons):
            daemon.stop()
        remove_segments(self.daemons)


def addr(daemon: Daemon) -> str:
    host, port = daemon.http
    return f"{host}:{port}"


@contextlib.contextmanager
def cluster(tmp: Path) -> Iterator[Cluster]:
    c = Cluster(tmp)
    try:
        c.boot()
        yield c
    finally:
        c.stop()


class Graphite(LocalServer):
    """A stand-in for graphite's ``/render`` (graphite itself is not installable here): an
    HTTP server answering every render with one data point, keeping the queries asked."""

    def __init__(self, value: float) -> None:
        self.queries: list[str] = []
        queries = self.queries

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                queries.append(self.path)
                body = json.dumps([{"target": "t", "datapoints": [[value, 1700000000]]}]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)


class AuthProxy(LocalServer):
    """A small reverse proxy in front of nsqadmin, as operators deploy it: it forwards every
    request unchanged (path included, so nsqadmin runs at a ``--base-path``) and adds the
    header that names the authenticated user, as an auth proxy would."""

    def __init__(self, upstream: str, header: str, user: str) -> None:
        client = httpx.Client(base_url=upstream, timeout=30)
        self.client = client

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "accept-encoding", header.lower())}
                headers[header] = user
                headers["Accept-Encoding"] = "identity"
                upstream = client.request(self.command, self.path, content=body, headers=headers)
                self.send_response(upstream.status_code)
                for key in ("content-type", "location", "x-nsq-content-type"):
                    if key in upstream.headers:
                        self.send_header(key, upstream.headers[key])
                self.send_header("Content-Length", str(len(upstream.content)))
                self.end_headers()
                self.wfile.write(upstream.content)

            do_GET = do_POST = do_DELETE = do_PUT = _forward

        super().__init__(Handler)

    def close(self) -> None:
        super().close()
        self.client.close()
