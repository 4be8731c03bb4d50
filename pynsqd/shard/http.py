"""nsqd's HTTP API (``/ping``, ``/info``, ``/stats``) as a Starlette app over a shard.

Responses follow NSQ's conventions (NSQ-FACTS §2.0): JSON with
``Content-Type: application/json; charset=utf-8``, errors as ``{"message": "<CODE>"}``, and
the ``X-NSQ-Content-Type: nsq; version=1.0`` header on every API response.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from pynsqd import NSQ_VERSION
from pynsqd.shard.broker import Broker
from pynsqd.shard.stats import node_stats

NSQ_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}
_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 500: "INTERNAL_ERROR"}


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, headers=NSQ_HEADERS,
                    media_type="application/json; charset=utf-8")


def error_response(message: str, status: int) -> Response:
    return json_response({"message": message}, status)


def _bool_param(request: Request, name: str, default: bool = True) -> bool:
    raw = request.query_params.get(name)
    if raw in ("false", "0"):
        return False
    if raw in ("true", "1"):
        return True
    return default


def build_app(broker: Broker, info: dict[str, Any]) -> Starlette:
    """The HTTP app of one shard; ``info`` is the static part of ``/info``."""

    async def ping(request: Request) -> Response:
        if broker.health != "OK":
            return PlainTextResponse(broker.health, status_code=500)
        return PlainTextResponse("OK")

    async def info_route(request: Request) -> Response:
        return json_response({"version": NSQ_VERSION, **info})

    async def stats(request: Request) -> Response:
        q = request.query_params
        data = node_stats(broker, q.get("topic", ""), q.get("channel", ""),
                          _bool_param(request, "include_clients"), _bool_param(request, "include_mem"))
        return json_response(data)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return error_response(_HTTP_CODES.get(status, "INTERNAL_ERROR"), status)

    routes = [
        Route("/ping", ping, methods=["GET", "HEAD"]),
        Route("/info", info_route, methods=["GET", "HEAD"]),
        Route("/stats", stats, methods=["GET", "HEAD"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, 500: http_error})
