"""What nsqd, nsqlookupd and nsqadmin share to speak NSQ's HTTP: errors, query strings,
JSON, responses and routing (how requests are read and bounded: ``httpparse.py``).

- ``HTTPError(status, code)``: a handler's failure, answered ``{"message": "<CODE>"}``.
- ``parse_query``: Go's ``url.ParseQuery`` (a bad ``%`` escape or a ``;`` is 400
  ``INVALID_REQUEST``; bytes that are not UTF-8 decode as U+FFFD, never an error, as Go
  accepts any bytes).
- ``go_json``: JSON as Go's ``encoding/json`` writes it; ``json_response``,
  ``api_response`` (strings as text, as nsqd writes them) and ``error_response``: NSQ's
  ``internal/http_api`` V1 answers (``X-NSQ-Content-Type: nsq; version=1.0``).
- ``RouteTable``: httprouter's matching as NSQ configures it, for a table of
  ``(method, "/path/:param", handler)``; see its docstring.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import unquote_to_bytes

import orjson

from pynsqd.lazyimport import lazy_module

if TYPE_CHECKING:
    from starlette import responses
    from starlette.responses import Response
else:
    responses = lazy_module("starlette.responses")  # imported by the first response made here

JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
NSQ_CONTENT_TYPE = ("X-NSQ-Content-Type", "nsq; version=1.0")
NSQ_HEADER = (b"x-nsq-content-type", b"nsq; version=1.0")

_GO_ESCAPES = ((b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"),
               ("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029"))
_HEX = frozenset(b"0123456789abcdefABCDEF")


class HTTPError(Exception):
    """An API error: ``status`` and the ``message`` code (``MISSING_ARG_TOPIC`` …)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Sorted(dict[str, Any]):
    """A JSON object rendered with sorted keys, as Go renders a map."""


def go_json(data: Any) -> bytes:
    """JSON as Go's ``encoding/json`` writes it (HTML-safe escaping)."""
    option = orjson.OPT_SORT_KEYS if isinstance(data, Sorted) else 0
    out = orjson.dumps(data, option=option)
    for raw, escaped in _GO_ESCAPES:
        if raw in out:
            out = out.replace(raw, escaped)
    return out


Params = dict[str, list[str]]


def parse_query(raw: bytes) -> Params:
    """Go's ``url.ParseQuery``; raises ``HTTPError`` 400 ``INVALID_REQUEST`` where Go errs."""
    values: Params = {}
    for part in raw.split(b"&"):
        if b";" in part:
            raise HTTPError(400, "INVALID_REQUEST")
        if not part:
            continue
        key, _, value = part.partition(b"=")
        values.setdefault(_unescape(key), []).append(_unescape(value))
    return values


def _unescape(raw: bytes) -> str:
    pos = raw.find(b"%")
    while pos >= 0:
        pair = raw[pos + 1:pos + 3]
        if len(pair) != 2 or not _HEX.issuperset(pair):
            raise HTTPError(400, "INVALID_REQUEST")
        pos = raw.find(b"%", pos + 3)
    if b"+" in raw:
        raw = raw.replace(b"+", b" ")
    if b"%" in raw:
        raw = unquote_to_bytes(raw)
    return raw.decode("utf-8", "replace")


def api_response(data: Any = None, status: int = 200) -> Response:
    """nsqd's V1 answer: ``None`` as an empty body, bytes/str as text, anything else as JSON."""
    if isinstance(data, (str, bytes)):
        return responses.Response(data, status, dict([NSQ_CONTENT_TYPE]), TEXT_TYPE)
    return json_response(data, status)


def json_response(data: Any = None, status: int = 200) -> Response:
    """NSQ's V1 answer: ``None`` as an empty body, anything else (a string too) as JSON."""
    headers = dict([NSQ_CONTENT_TYPE])
    if data is None:
        return responses.Response(b"", status, headers)
    return responses.Response(go_json(data), status, headers, JSON_TYPE)


def error_response(status: int, message: str) -> Response:
    return json_response({"message": message}, status)


H = TypeVar("H")


@dataclasses.dataclass(frozen=True)
class Match(Generic[H]):
    """``RouteTable.match``'s answer: a ``handler`` with its path ``params``; else ``allowed``
    (the methods of a route at this path: non-empty means 405) and ``redirect`` (the path
    httprouter would redirect to, or ``None``)."""

    handler: H | None = None
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    allowed: tuple[str, ...] = ()
    redirect: str | None = None


class RouteTable(Generic[H]):
    """julienschmidt/httprouter as NSQ's daemons configure it, over ``(method, path,
    handler)`` rows; a ``:name`` segment matches one non-empty segment, given in ``params``.

    ``match`` finds the handler for a method and path. Without one it reports the methods
    the path has (405, and what ``OPTIONS`` answers) and the path to redirect to: the path
    without its trailing slash (RedirectTrailingSlash), or the cleaned path matched without
    regard to case (RedirectFixedPath, for routes without parameters)."""

    def __init__(self, rows: list[tuple[str, str, H]]) -> None:
        self.rows = [(method, path, _pattern(path), handler) for method, path, handler in rows]

    def match(self, method: str, path: str) -> Match[H]:
        allowed: list[str] = []
        for row_method, _, pattern, handler in self.rows:
            m = pattern.match(path)
            if m is None:
                continue
            if row_method == method:
                return Match(handler, m.groupdict())
            if row_method not in allowed:
                allowed.append(row_method)
        return Match(allowed=tuple(allowed), redirect=self._fixed_path(method, path) if not allowed else None)

    def routes(self, path: str) -> list[str]:
        """The methods of the routes that match ``path``."""
        return [method for method, _, pattern, _ in self.rows if pattern.match(path)]

    def _fixed_path(self, method: str, path: str) -> str | None:
        if method == "CONNECT" or path == "/":
            return None
        mine = [(p, pattern) for m, p, pattern, _ in self.rows if m == method]
        if path.endswith("/") and any(pattern.match(path[:-1]) for _, pattern in mine):
            return path[:-1]
        clean = posixpath.normpath("/" + path).lstrip("/")
        clean = "/" + clean.rstrip("/") if clean else "/"
        for candidate, _ in mine:
            if ":" not in candidate and candidate.lower() == clean.lower() and candidate != path:
                return candidate
        return None


def _pattern(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r":(\w+)", r"(?P<\1>[^/]+)", path) + "$")

