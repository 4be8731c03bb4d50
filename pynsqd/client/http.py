"""HTTP calls to nsqd and nsqlookupd (publish, lookup, stats), on ``httpx``.

``request`` is the one place where ``httpx`` transport errors become ``ConnectError`` /
``NSQTimeoutError`` / ``TransportError`` and a non-2xx answer becomes ``HTTPError`` with NSQ's
message code (nsqd answers ``{"message": "<CODE>"}``). ``httpx`` is imported by the first
client made (a quarter of a second): a process that only speaks TCP never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from pynsqd.client.errors import ConnectError, HTTPError, NSQTimeoutError, TransportError

if TYPE_CHECKING:
    import httpx


def base_url(address: str) -> str:
    """``host:port`` or a full URL → ``http://host:port`` (no trailing slash)."""
    address = address.rstrip("/")
    return address if "://" in address else f"http://{address}"


def error_code(response: httpx.Response) -> str:
    try:
        data = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.text.strip() or response.reason_phrase
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return response.text.strip()


async def request(client: httpx.AsyncClient, method: str, url: str, *,
                  params: dict[str, Any] | None = None, content: bytes | None = None,
                  headers: dict[str, str] | None = None, ok_statuses: tuple[int, ...] = ()
                  ) -> httpx.Response:
    """Make one request; raise ``HTTPError`` for a status outside 2xx and ``ok_statuses``."""
    import httpx

    try:
        response = await client.request(method, url, params=params, content=content, headers=headers)
    except httpx.TimeoutException as exc:
        raise NSQTimeoutError(f"{method} {url} timed out ({type(exc).__name__})") from exc
    except httpx.ConnectError as exc:
        raise ConnectError(f"{method} {url} failed: {type(exc).__name__} {exc}".rstrip()) from exc
    except httpx.HTTPError as exc:
        raise TransportError(f"{method} {url} failed: {type(exc).__name__} {exc}".rstrip()) from exc
    if not 200 <= response.status_code < 300 and response.status_code not in ok_statuses:
        raise HTTPError(response.status_code, error_code(response), url)
    return response


def make_client(connect_timeout: float = 2.0, request_timeout: float = 5.0) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` with NSQ's utility defaults (2 s connect, 5 s request)."""
    import httpx

    return httpx.AsyncClient(timeout=httpx.Timeout(request_timeout, connect=connect_timeout))
