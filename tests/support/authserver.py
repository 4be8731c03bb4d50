"""A small real auth server for the AUTH tests: stdlib HTTP on a free port, in a thread.

``AuthServer.replies`` maps a secret to ``(status, json_body)``; unknown secrets get 403.
Every request is recorded (method, path, query or JSON body, Accept header)."""

from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class AuthServer:
    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.replies: dict[str, tuple[int, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, params: dict[str, list[str]]) -> None:
                url = urlsplit(self.path)
                server.requests.append({"method": self.command, "path": url.path, "params": params,
                                        "accept": self.headers.get("Accept"),
                                        "content_type": self.headers.get("Content-Type")})
                secret = (params.get("secret") or [""])[0]
                status, body = server.replies.get(secret, (403, {"message": "FORBIDDEN"}))
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer(parse_qs(urlsplit(self.path).query, keep_blank_values=True))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(json.loads(self.rfile.read(length) or b"{}"))

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if ssl_context is not None:
            self.httpd.socket = ssl_context.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> AuthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def grant(*authorizations: tuple[str, list[str], list[str]], ttl: int = 3600, identity: str = "",
          identity_url: str = "") -> tuple[int, dict[str, Any]]:
    """A 200 reply granting ``(topic_regex, channel_regexes, permissions)`` entries."""
    return 200, {"ttl": ttl, "identity": identity, "identity_url": identity_url,
                 "authorizations": [{"topic": t, "channels": c, "permissions": p} for t, c, p in authorizations]}
