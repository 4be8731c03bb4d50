"""The cluster as nsqadmin sees it: every nsqlookupd and nsqd, read over their public HTTP APIs.

Theory of operation
-------------------
``Cluster`` holds one ``httpx.AsyncClient`` (connection pooling, the connect and request
timeouts and TLS settings of the ``--http-client-*`` flags) and asks many nodes at once:
``fan_out`` sends one request per URL concurrently and returns the decoded answers together
with one error text per node that failed (refused, timed out, non-200, bad JSON), in Go's
words where they are its own (``got response 404 Not Found "{\"message\":…}"``, ``Get
"<url>": <reason>``). Callers turn the errors into NSQ's reporting: all failed →
``AllFailed`` (the API answers 502 ``UPSTREAM_ERROR: failed to query any nsqlookupd: …``, or
``… any nsqd: …``, which is also the answer when a topic has no producer to ask), some
failed → ``Partial`` warnings (200 with ``"message": "WARNING: …"``). Only documented
routes of NSQ v1.3 are used (``/topics``, ``/nodes``, ``/lookup``, ``/channels`` and the
create/delete/tombstone routes on nsqlookupd; ``/info``, ``/stats?format=json`` and the
topic/channel action routes on nsqd), so any NSQ v1.3 node works, not only pynsqd's.

Producers (nsqd nodes) are keyed as NSQ keys them, ``<broadcast_address>:<http_port>``; in
``--nsqd-http-address`` mode the configured addresses are the producers and ``/info`` names
them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson

from pynsqd.admin.config import AdminOptions
from pynsqd.options import SECOND
from pynsqd.wire.errors import go_quote


class AllFailed(Exception):
    """Every upstream asked failed; the text lists each failure (502 UPSTREAM_ERROR)."""


@dataclasses.dataclass
class Producer:
    """One nsqd, as nsqadmin's ``/api/nodes`` shows it."""

    remote_addresses: list[str]
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    topics: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    out_of_date: bool = False

    @property
    def http_address(self) -> str:
        return join_host_port(self.broadcast_address, self.http_port)

    @property
    def tcp_address(self) -> str:
        return join_host_port(self.broadcast_address, self.tcp_port)

    def public(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def base_url(address: str) -> str:
    return address.rstrip("/") if "://" in address else f"http://{address}"


def _version_key(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("-")[0].split("."):
        try:
            parts.append(int(piece))
        except ValueError:
            parts.append(0)
    return tuple(parts)


class Cluster:
    """Reads and changes the cluster named by ``--lookupd-http-address``/``--nsqd-http-address``."""

    def __init__(self, options: AdminOptions) -> None:
        self.options = options
        timeout = httpx.Timeout(options.http_client_request_timeout / SECOND,
                                connect=options.http_client_connect_timeout / SECOND)
        verify: bool | ssl.SSLContext = True
        if options.http_client_tls_insecure_skip_verify:
            verify = False
        elif options.http_client_tls_root_ca_file or options.http_client_tls_cert:
            ctx = ssl.create_default_context(cafile=options.http_client_tls_root_ca_file or None)
            if options.http_client_tls_cert:
                ctx.load_cert_chain(options.http_client_tls_cert, options.http_client_tls_key)
            verify = ctx
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        self.client = httpx.AsyncClient(timeout=timeout, verify=verify, limits=limits,
                                        headers={"Accept": "application/vnd.nsq; version=1.0"})

    @property
    def lookupds(self) -> list[str]:
        return self.options.lookupd_http_addresses

    @property
    def nsqds(self) -> list[str]:
        return self.options.nsqd_http_addresses

    async def close(self) -> None:
        await self.client.aclose()

    # --- transport ------------------------------------------------------------------------

    async def request(self, method: str, address: str, path: str, params: dict[str, str] | None = None,
                      ok_statuses: Iterable[int] = ()) -> Any:
        """One request; returns decoded JSON (None for an empty body or an accepted non-200).
        Raises ``UpstreamError`` naming the request and the reason on any failure."""
        url = base_url(address) + path + ("?" + urlencode(params) if params else "")
        try:
            response = await self.client.request(method, url)
        except httpx.HTTPError as exc:
            raise UpstreamError(f'{method.capitalize()} "{url}": {_reason(exc)}') from None
        if response.status_code != 200:
            if response.status_code in ok_statuses:
                return None
            raise UpstreamError(f"got response {response.status_code} {response.reason_phrase} "
                                f"{go_quote(response.content)}")
        if not response.content:
            return None
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise UpstreamError(f"{method} {url}: response is not JSON") from None

    async def fan_out(self, method: str, calls: list[tuple[str, str, dict[str, str] | None]],
                      ok_statuses: Iterable[int] = ()) -> tuple[list[tuple[str, Any]], list[str]]:
        """Send every ``(address, path, params)`` at once. Returns ``([(address, data)], errors)``."""
        statuses = tuple(ok_statuses)
        results = await asyncio.gather(*(self.request(method, a, p, q, statuses) for a, p, q in calls),
                                       return_exceptions=True)
        answers: list[tuple[str, Any]] = []
        errors: list[str] = []
        for (address, _, _), result in zip(calls, results):
            if isinstance(result, UpstreamError):
                errors.append(str(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append((address, result))
        return answers, errors

    # --- reads ----------------------------------------------------------------------------

    async def topics(self) -> tuple[list[str], list[str]]:
        """Every topic known to the lookupds (or present on the nsqds), sorted."""
        if self.lookupds:
            answers, errors = await self.fan_out("GET", [(a, "/topics", None) for a in self.lookupds])
            names = {t for _, data in answers for t in (data or {}).get("topics") or []}
            total = len(self.lookupds)
        else:
            stats, errors = await self.node_stats(self.nsqds, include_clients=False)
            names = {t["topic_name"] for _, data in stats for t in data.get("topics") or []}
            total = len(self.nsqds)
        _raise_if_all_failed(errors, total, "nsqlookupd" if self.lookupds else "nsqd")
        return sorted(names), errors

    async def topic_channels(self, topic: str) -> tuple[list[str], list[str]]:
        answers, errors = await self.fan_out("GET", [(a, "/channels", {"topic": topic}) for a in self.lookupds])
        _raise_if_all_failed(errors, len(self.lookupds), "nsqlookupd")
        return sorted({c for _, data in answers for c in (data or {}).get("channels") or []}), errors

    async def producers(self) -> tuple[list[Producer], list[str]]:
        """Every nsqd of the cluster, merged across lookupds, with its topics."""
        if not self.lookupds:
            return await self._nsqd_producers(self.nsqds, None)
        answers, errors = await self.fan_out("GET", [(a, "/nodes", None) for a in self.lookupds])
        _raise_if_all_failed(errors, len(self.lookupds), "nsqlookupd")
        merged: dict[str, Producer] = {}
        for _, data in answers:
            for peer in (data or {}).get("producers") or []:
                producer = self._merge(merged, peer)
                tombstones = peer.get("tombstones") or []
                known = {t["topic"]: t for t in producer.topics}
                for i, topic in enumerate(peer.get("topics") or []):
                    dead = bool(tombstones[i]) if i < len(tombstones) else False
                    if topic in known:
                        known[topic]["tombstoned"] = known[topic]["tombstoned"] or dead
                    else:
                        known[topic] = {"topic": topic, "tombstoned": dead}
                producer.topics = sorted(known.values(), key=lambda t: t["topic"])
        return _finish(merged), errors

    async def topic_producers(self, topic: str, strict: bool = False) -> tuple[list[Producer], list[str]]:
        """The nsqds that hold ``topic`` (lookupd ``/lookup``; a 404 there means none, or, when
        ``strict`` as nsqadmin's topic and channel pages take it, that lookupd failed)."""
        if not self.lookupds:
            return await self._nsqd_producers(self.nsqds, topic)
        answers, errors = await self.fan_out("GET", [(a, "/lookup", {"topic": topic}) for a in self.lookupds],
                                             ok_statuses=() if strict else (404,))
        _raise_if_all_failed(errors, len(self.lookupds), "nsqlookupd")
        merged: dict[str, Producer] = {}
        for _, data in answers:
            for peer in (data or {}).get("producers") or []:
                self._merge(merged, peer)
        return _finish(merged), errors

    def _merge(self, merged: dict[str, Producer], peer: dict[str, Any]) -> Producer:
        key = join_host_port(peer["broadcast_address"], peer["http_port"])
        producer = merged.get(key)
        remote = peer.get("remote_address", "")
        if producer is None:
            producer = merged[key] = Producer(
                remote_addresses=[], remote_address=remote, hostname=peer.get("hostname", ""),
                broadcast_address=peer["broadcast_address"], tcp_port=peer.get("tcp_port", 0),
                http_port=peer["http_port"], version=peer.get("version", ""))
        if remote and remote not in producer.remote_addresses:
            producer.remote_addresses.append(remote)
        return producer

    async def _nsqd_producers(self, addresses: list[str], topic: str | None) -> tuple[list[Producer], list[str]]:
        infos, errors = await self.fan_out("GET", [(a, "/info", None) for a in addresses])
        stats, more = await self.node_stats([a for a, _ in infos], topic=topic, include_clients=False)
        errors += more
        _raise_if_all_failed(errors, len(addresses), "nsqd")
        topics_of = {address: [t["topic_name"] for t in data.get("topics") or []] for address, data in stats}
        merged: dict[str, Producer] = {}
        for address, info in infos:
            if address not in topics_of or (topic is not None and topic not in topics_of[address]):
                continue
            producer = self._merge(merged, {**info, "remote_address": address})
            producer.topics = [{"topic": t, "tombstoned": False} for t in sorted(topics_of[address])]
        return _finish(merged), errors

    async def node_stats(self, addresses: list[str], topic: str | None = None, channel: str | None = None,
                         include_clients: bool = True) -> tuple[list[tuple[str, Any]], list[str]]:
        """``/stats?format=json`` of each nsqd (filtered as asked); ``[(address, stats)]``."""
        params = {"format": "json", "include_clients": "true" if include_clients else "false",
                  "include_mem": "false"}
        if topic:
            params["topic"] = topic
            if channel:
                params["channel"] = channel
        answers, errors = await self.fan_out("GET", [(a, "/stats", params) for a in addresses])
        return [(a, d) for a, d in answers if isinstance(d, dict)], errors

    async def producer_stats(self, producers: list[Producer], topic: str | None = None,
                             channel: str | None = None, include_clients: bool = True
                             ) -> tuple[list[tuple[Producer, Any]], list[str]]:
        """Stats of each producer, paired with it; raises ``AllFailed`` if none answered, or
        there was none to ask (nsqadmin's ``GetNSQDStats``)."""
        by_address = {p.http_address: p for p in producers}
        answers, errors = await self.node_stats(list(by_address), topic, channel, include_clients)
        _raise_if_all_failed(errors, len(producers), "nsqd", none_fails=True)
        return [(by_address[a], d) for a, d in answers], errors


class UpstreamError(Exception):
    """One upstream request failed; the text says which and why."""


def _reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timeout"
    if isinstance(exc, httpx.TimeoutException):
        return "request timeout"
    cause: BaseException | None = exc
    while cause is not None:  # the OS's reason ("Connection refused") beats httpx's summary
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        if isinstance(cause, ExceptionGroup) and cause.exceptions:
            cause = cause.exceptions[0]
            continue
        cause = cause.__cause__ or cause.__context__
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def _raise_if_all_failed(errors: list[str], total: int, what: str, none_fails: bool = False) -> None:
    """``AllFailed`` in Go's words when every one of ``total`` ``what`` failed (or, with
    ``none_fails``, there were none)."""
    if len(errors) >= total and (errors or none_fails):
        raise AllFailed(f"failed to query any {what}: " + "\n".join(errors))


def _finish(merged: dict[str, Producer]) -> list[Producer]:
    producers = sorted(merged.values(), key=lambda p: (p.hostname, p.broadcast_address, p.http_port))
    if producers:
        newest = max(_version_key(p.version) for p in producers)
        for p in producers:
            p.out_of_date = _version_key(p.version) < newest
    return producers
