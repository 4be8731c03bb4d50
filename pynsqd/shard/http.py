"""nsqd's HTTP API over a shard, as NSQ v1.3 serves it (NSQ's ``nsqd/http.go`` and ``internal/http_api``).

Theory of operation
-------------------
``NsqdHTTP`` is a plain ASGI app. ``POST /pub`` and ``POST /mpub`` — the paths that carry
almost all HTTP traffic — are handled right here on raw ASGI messages: the body is read with
its limit enforced as it arrives (``Content-Length`` first, then the bytes actually read) and
the answer is two ``send`` calls. Everything else goes through an ``httpkit.RouteTable``.

Responses follow nsqd's conventions: JSON with ``Content-Type: application/json;
charset=utf-8``; errors as ``{"message": "<CODE>"}`` with nsqd's status and code, checked in
nsqd's order; ``X-NSQ-Content-Type: nsq; version=1.0`` on every API answer; unknown paths 404
``NOT_FOUND``, wrong methods 405 ``METHOD_NOT_ALLOWED``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from pynsqd import NSQ_VERSION, logs
from pynsqd.httpkit import (
    JSON_TYPE,
    NSQ_HEADER,
    TEXT_TYPE,
    HTTPError,
    Match,
    RouteTable,
    api_response,
    error_response,
    parse_query,
)
from pynsqd.lazyimport import lazy_module
from pynsqd.node.config import NsqdOptions
from pynsqd.options import config_value
from pynsqd.shard.broker import RING_RETRY, Backpressure, Broker, BrokerError
from pynsqd.shard.httppub import Later, Step
from pynsqd.shard.pubgroup import PublishGroup
from pynsqd.shared_flags import LOG_LEVELS
from pynsqd.wire.commands import parse_mpub_body
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.names import is_valid_name

if TYPE_CHECKING:
    from starlette import requests, responses
    from starlette.requests import Request
    from starlette.responses import Response
else:  # the framework loads with the first routed request: publishes and /ping need none of it
    requests = lazy_module("starlette.requests")
    responses = lazy_module("starlette.responses")

log = logging.getLogger("pynsqd.shard")

QUERY_CACHE = 1024  # publish query strings remembered (parsed and checked)
Handler = Callable[["Request"], Awaitable["Response"]]
ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]


class NsqdHTTP:
    """The HTTP API of one shard. ``persist(topic)`` writes the topic's paused flags to ``nsqd.dat``;
    ``set_lookupd_addresses`` applies ``PUT /config/nsqlookupd_tcp_addresses``."""

    def __init__(self, broker: Broker, opts: NsqdOptions, info: dict[str, Any],
                 persist: Callable[[str], None],
                 set_lookupd_addresses: Callable[[list[str]], None]) -> None:
        self.broker = broker
        self.opts = opts
        self.info = info
        self.persist = persist
        self.set_lookupd_addresses = set_lookupd_addresses
        self.tls_required_port = 0  # with --tls-required=true: plain HTTP gets 403 naming this port
        self.busy: tuple[type[Exception], ...] = (Backpressure,)  # a publish step to retry later
        self._queries: dict[bytes, tuple[dict[str, list[str]], str]] = {}
        self.group = PublishGroup(broker, opts.max_body_size)  # plain /pub, a batch per topic and loop turn
        self.routes: RouteTable[Handler] = RouteTable([
            ("GET", "/ping", self.ping),
            ("GET", "/info", self.info_route),
            ("POST", "/topic/create", self.topic_create),
            ("POST", "/topic/delete", self.topic_delete),
            ("POST", "/topic/empty", self.topic_empty),
            ("POST", "/topic/pause", self.topic_pause),
            ("POST", "/topic/unpause", self.topic_pause),
            ("POST", "/channel/create", self.channel_create),
            ("POST", "/channel/delete", self.channel_delete),
            ("POST", "/channel/empty", self.channel_empty),
            ("POST", "/channel/pause", self.channel_pause),
            ("POST", "/channel/unpause", self.channel_pause),
            ("GET", "/config/:opt", self.config),
            ("PUT", "/config/:opt", self.config),
        ])

    # --- the lean publish path ------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        if self.tls_required_port and path is not None and scope.get("scheme") != "https":
            await send_answer(send, 403, self.tls_required_body(), JSON_TYPE)
            return
        if path == "/pub" or path == "/mpub":
            try:
                if scope["method"] != "POST":
                    raise HTTPError(405, "METHOD_NOT_ALLOWED")
                self.check_length(path, _content_length(scope))
                body = await _read_body(receive, self.body_limit(path))
                for action, args in self.publish_steps(path, scope.get("query_string", b""), body):
                    await _until_room(action, *args)
            except HTTPError as exc:
                await send_answer(send, exc.status, orjson.dumps({"message": exc.message}), JSON_TYPE)
            else:
                await send_answer(send, 200, b"OK", TEXT_TYPE)
            return
        if scope["type"] == "http":
            response = await self._route(scope, receive)
            await response(scope, receive, send)

    async def _route(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]]) -> Response:
        """Every route but the publishes: a GET route answers HEAD too; an unknown path is 404
        ``NOT_FOUND``, another method 405 ``METHOD_NOT_ALLOWED``; a path with a trailing slash
        whose route exists is redirected (307) to the path without it."""
        method, path = scope["method"], scope["path"]
        match = self.routes.match("GET" if method == "HEAD" else method, path)
        request = requests.Request({**scope, "path_params": match.params}, receive)
        if match.handler is None:
            return route_miss(self.routes, match, request) or error_response(404, "NOT_FOUND")
        try:
            response: Response = await match.handler(request)
        except HTTPError as exc:
            return error_response(exc.status, exc.message)
        except Exception:
            log.exception("HTTP %s %s failed", method, path)
            return error_response(500, "INTERNAL_ERROR")
        return response

    def tls_required_body(self) -> bytes:
        return f'{{"message": "TLS_REQUIRED", "https_port": {self.tls_required_port}}}'.encode()

    def body_limit(self, path: str) -> int:
        """The most body bytes ``POST /pub`` (``path``) or ``/mpub`` reads."""
        return self.opts.max_msg_size if path == "/pub" else self.opts.max_body_size

    def check_length(self, path: str, content_length: int) -> None:
        """nsqd's first check, on the ``Content-Length`` header (-1: none) before any body."""
        if content_length > self.body_limit(path):
            raise HTTPError(413, "MSG_TOO_BIG" if path == "/pub" else "BODY_TOO_BIG")

    def publish_steps(self, path: str, query: bytes, body: bytes | None) -> Iterator[Step]:
        """``POST /pub`` or ``/mpub`` once its body was read (``None``: it passed the limit):
        nsqd's checks in nsqd's order (``HTTPError``), yielding the broker calls to make, each
        to be retried by the caller while it raises ``Backpressure``; a plain ``/pub`` joins
        the loop turn's batch (``pubgroup.py``) and its call returns the ``Later`` to wait
        for. Transport-free: the ASGI path above and the connection protocol
        (``httppub.py``) both drive it. ``/pub`` has one step, checked here (the hot path:
        no generator); ``/mpub`` creates its topic before it checks the body."""
        if path == "/pub":
            return iter((self._pub_step(query, body),))
        return self._mpub_steps(query, body)

    def _pub_step(self, query: bytes, body: bytes | None) -> Step:
        if body is None:
                raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        params, topic = self._topic_from_query(query)
        delay = 0
        if "defer" in params:
            raw = params["defer"][0]
            if not re.fullmatch(r"[+-]?[0-9]+", raw):
                raise HTTPError(400, "INVALID_DEFER")
            delay = int(raw)
            if delay < 0 or delay * 1_000_000 > self.opts.max_req_timeout:
                raise HTTPError(400, "INVALID_DEFER")
        if delay:
            return self._publish, (self.broker.publish_deferred, topic, body, delay)
        return self.group.join, (topic, body)

    def _mpub_steps(self, query: bytes, body: bytes | None) -> Iterator[Step]:
        opts = self.opts
        params, topic = self._topic_from_query(query)
        yield self.broker.ensure_topic, (topic,)  # nsqd creates it before reading the body
        binary = False
        if "binary" in params:
            value = params["binary"][0]
            binary = value not in ("0", "f", "F", "false", "FALSE", "False")
        if body is None:
            raise HTTPError(413, "BODY_TOO_BIG")
        if binary:
            try:
                bodies = parse_mpub_body(body, opts.max_msg_size, opts.max_body_size)
            except ProtocolError as exc:
                raise HTTPError(413, exc.code[2:]) from None
        else:
            bodies = [line for line in body.split(b"\n") if line]
            if any(len(line) > opts.max_msg_size for line in bodies):
                raise HTTPError(413, "MSG_TOO_BIG")
        if bodies:
            yield self._publish, (self.broker.publish, topic, bodies)

    @staticmethod
    def _publish(action: Callable[..., None], topic: str, *args: Any) -> None:
        try:
            action(topic, *args)
        except BrokerError as exc:
            log.error("HTTP publish to %s failed - %s", topic, exc)
            raise HTTPError(503, "EXITING") from None

    def _topic_from_query(self, query: bytes) -> tuple[dict[str, list[str]], str]:
        """The parameters and the valid topic of a query string (``HTTPError`` if none).
        Publishers repeat the same few query strings: good ones are remembered (read-only)."""
        known = self._queries.get(query)
        if known is not None:
            return known
        params = parse_query(query)
        names = params.get("topic")
        if not names:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(names[0]):
            raise HTTPError(400, "INVALID_TOPIC")
        if len(self._queries) >= QUERY_CACHE:
            self._queries.clear()
        self._queries[query] = params, names[0]
        return params, names[0]

    # --- node -----------------------------------------------------------------------------
    async def ping(self, request: Request) -> Response:
        if self.broker.health != "OK":
            return responses.Response(self.broker.health, status_code=500, media_type=TEXT_TYPE)
        return responses.Response("OK", media_type=TEXT_TYPE)

    async def info_route(self, request: Request) -> Response:
        return api_response({"version": NSQ_VERSION, **self.info})

    # --- topics and channels --------------------------------------------------------------
    def _params(self, request: Request) -> dict[str, list[str]]:
        return parse_query(request.scope.get("query_string", b""))

    def _existing_topic(self, params: dict[str, list[str]], validate: bool) -> Any:
        names = params.get("topic")
        if not names:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if validate and not is_valid_name(names[0]):
            raise HTTPError(400, "INVALID_TOPIC")
        topic = self.broker.topics.get(names[0])
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic

    def _topic_and_channel_args(self, request: Request) -> tuple[Any, str]:
        params = self._params(request)
        topics, channels = params.get("topic"), params.get("channel")
        if not topics:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topics[0]):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        if not channels:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channels[0]):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        topic = self.broker.topics.get(topics[0])
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic, channels[0]

    def _existing_channel(self, request: Request) -> Any:
        topic, name = self._topic_and_channel_args(request)
        channel = topic.channels.get(name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return channel

    async def topic_create(self, request: Request) -> Response:
        _, name = self._topic_from_query(request.scope.get("query_string", b""))
        self.broker.get_topic(name)
        return api_response()

    async def topic_delete(self, request: Request) -> Response:
        names = self._params(request).get("topic")
        if not names:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not self.broker.delete_topic(names[0]):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return api_response()

    async def topic_empty(self, request: Request) -> Response:
        self._existing_topic(self._params(request), validate=True).empty()
        return api_response()

    async def topic_pause(self, request: Request) -> Response:
        topic = self._existing_topic(self._params(request), validate=False)
        topic.unpause() if request.url.path.endswith("unpause") else topic.pause()
        self.persist(topic.name)
        return api_response()

    async def channel_create(self, request: Request) -> Response:
        topic, name = self._topic_and_channel_args(request)
        self.broker.get_channel(topic, name)
        return api_response()

    async def channel_delete(self, request: Request) -> Response:
        topic, name = self._topic_and_channel_args(request)
        if not self.broker.delete_channel(topic, name):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return api_response()

    async def channel_empty(self, request: Request) -> Response:
        self._existing_channel(request).empty()
        return api_response()

    async def channel_pause(self, request: Request) -> Response:
        channel = self._existing_channel(request)
        channel.unpause() if request.url.path.endswith("unpause") else channel.pause()
        self.persist(channel.topic_name)
        return api_response()

    # --- /config --------------------------------------------------------------------------
    async def config(self, request: Request) -> Response:
        opt = request.path_params["opt"]
        if request.method == "PUT":
            body = await _read_body(request.receive, self.opts.max_msg_size)
            if not body:
                raise HTTPError(413, "INVALID_VALUE")
            self.apply_option(opt, body)
        try:
            value = config_value(self.opts, opt)
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None
        if opt == "log_level":  # nsqd's LogLevel is an int type: debug 1 ... fatal 5
            value = LOG_LEVELS.index(value) + 1
        return api_response(value)

    def apply_option(self, opt: str, body: bytes) -> None:
        """``PUT /config/<opt>``: set one option from a request body. Raises ``HTTPError``."""
        if opt == "nsqlookupd_tcp_addresses":
            try:
                value = orjson.loads(body)
            except orjson.JSONDecodeError:
                value = None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise HTTPError(400, "INVALID_VALUE")
            self.set_lookupd_addresses(value)
        elif opt == "log_level":
            level = body.decode("utf-8", "replace").strip().lower()
            if level not in LOG_LEVELS:
                raise HTTPError(400, "INVALID_VALUE")
            self.opts.log_level = level
            logs.set_level(level)
        else:
            raise HTTPError(400, "INVALID_OPTION")


def route_miss(table: RouteTable[Any], match: Match[Any], request: Request) -> Response | None:
    """The answer to a request ``table`` has no handler for (``match``) when it has the path:
    405 ``METHOD_NOT_ALLOWED`` for another method, a redirect (307) for the path with a
    trailing slash; None when it does not know the path."""
    if match.allowed:
        return error_response(405, "METHOD_NOT_ALLOWED")
    path = request.scope["path"]
    bare = path.rstrip("/")
    if path != "/" and bare != path and table.routes(bare):
        return responses.RedirectResponse(request.url.replace(path=bare))
    return None


async def _until_room(action: Callable[..., Later | None], *args: Any) -> None:
    """Run a publish step; while the owner shard's inbound ring is full, wait and retry; a
    step answered ``Later`` is waited for."""
    while True:
        try:
            later = action(*args)
            break
        except Backpressure:
            await asyncio.sleep(RING_RETRY)
    if later is not None:
        done: asyncio.Future[HTTPError | None] = asyncio.get_running_loop().create_future()
        later.add(done.set_result)
        error = await done
        if error is not None:
            raise error


def _content_length(scope: dict[str, Any]) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                raise HTTPError(400, "INVALID_REQUEST") from None
    return -1


async def _read_body(receive: Callable[[], Awaitable[Any]], limit: int) -> bytes | None:
    """The request body, or None as soon as it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPError(400, "INVALID_REQUEST")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_answer(send: Callable[[Any], Awaitable[None]], status: int, body: bytes, content_type: str,
                      nsq_header: bool = True) -> None:
    """An answer on raw ASGI: ``body`` with its type and length, and NSQ's
    ``X-NSQ-Content-Type`` unless ``nsq_header`` is False (nsqd's plain-text routes, ``/ping``)."""
    headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
    if nsq_header:
        headers.append(NSQ_HEADER)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
