"""AUTH: nsqd's auth-server protocol, per-connection authorization state and its checks.

Theory of operation
-------------------
With ``--auth-http-address`` set, a client must send ``AUTH <secret>`` before SUB, PUB, MPUB
or DPUB. nsqd asks an auth server (``GET <addr>/auth?common_name=&remote_ip=&secret=&tls=``,
or a JSON POST of the same values as arrays) and caches the reply on the connection for
``ttl`` seconds; the first check after expiry asks again with the same secret.

``AuthState.from_reply`` validates a reply (permissions ``subscribe``/``publish`` only,
regexes that compile, ``ttl`` > 0) and ``allowed`` matches as Go's ``MatchString`` does
(unanchored); a channel of ``""`` means a publish check. ``AuthSession`` is the
connection's side, with no I/O: ``authenticate``/``check`` either answer, raise nsqd's
``ProtocolError``, or raise ``NeedQuery`` — the connection then pauses, awaits ``query``
(which stores the outcome) and runs the same command again, which now finds the outcome.
Errors reaching the auth server are logged, never shown to the client (``E_AUTH_FAILED``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson

from pynsqd.node.config import NsqdOptions
from pynsqd.options import SECOND
from pynsqd.wire.errors import ProtocolError

log = logging.getLogger("pynsqd.shard")

_PERMISSIONS = frozenset({"subscribe", "publish"})
MAX_REPLY = 1 << 20


class AuthError(Exception):
    """The auth server could not be reached or gave an unusable reply."""


class NeedQuery(Exception):
    """The command must wait for an auth-server query (``AuthSession.query``)."""


@dataclass
class Authorization:
    topic: re.Pattern[str]
    channels: list[re.Pattern[str]]
    permissions: frozenset[str]

    def allowed(self, topic: str, channel: str) -> bool:
        """nsqd's ``Authorization.IsAllowed``: publish when ``channel`` is empty."""
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if not self.topic.search(topic):
            return False
        return any(c.search(channel) for c in self.channels)


@dataclass
class AuthState:
    identity: str = ""
    identity_url: str = ""
    expires: float = 0.0  # time.monotonic()
    authorizations: list[Authorization] = field(default_factory=list)

    @classmethod
    def from_reply(cls, body: bytes, now: float) -> AuthState:
        """Parse an auth server's JSON reply. Raises ``AuthError``."""
        try:
            data = orjson.loads(body)
            ttl = data["ttl"]
            if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
                raise AuthError(f"invalid ttl {ttl!r}")
            auths = []
            for a in data.get("authorizations") or []:
                perms = frozenset(a.get("permissions") or [])
                if not perms <= _PERMISSIONS:
                    raise AuthError(f"unknown permission(s) {sorted(perms - _PERMISSIONS)}")
                auths.append(Authorization(re.compile(a["topic"]), [re.compile(c) for c in a.get("channels") or []],
                                           perms))
            return cls(identity=str(data.get("identity") or ""), identity_url=str(data.get("identity_url") or ""),
                       expires=now + ttl, authorizations=auths)
        except AuthError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, re.error) as exc:
            raise AuthError(f"invalid auth reply: {exc!r}") from None

    def expired(self, now: float) -> bool:
        return now >= self.expires

    def allowed(self, topic: str, channel: str) -> bool:
        return any(a.allowed(topic, channel) for a in self.authorizations)


class AuthSession:
    """One connection's authorization: the secret, the cached state, a pending outcome."""

    def __init__(self, opts: NsqdOptions, remote_ip: str) -> None:
        self.opts = opts
        self.enabled = bool(opts.auth_http_address)
        self.remote_ip = remote_ip
        self.secret = ""
        self.state: AuthState | None = None
        self._outcome: AuthState | AuthError | None = None
        self._querying = ""  # the secret being queried

    @property
    def authed(self) -> bool:
        """nsqd's ``HasAuthorizations``."""
        return self.state is not None and bool(self.state.authorizations)

    def _take_outcome(self, secret: str) -> AuthState:
        outcome, self._outcome = self._outcome, None
        if outcome is None:
            self._querying = secret
            raise NeedQuery
        if isinstance(outcome, AuthError):
            raise ProtocolError("E_AUTH_FAILED", "AUTH failed")
        return outcome

    def authenticate(self, secret: bytes) -> bytes:
        """The AUTH command after its state and parameter checks: the JSON response."""
        if self.authed:
            raise ProtocolError("E_INVALID", "AUTH already set")
        if not self.enabled:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        text = secret.decode("utf-8", "surrogateescape")
        self.state = self._take_outcome(text)
        self.secret = text
        if not self.authed:
            raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
        return orjson.dumps({"identity": self.state.identity, "identity_url": self.state.identity_url,
                             "permission_count": len(self.state.authorizations)})

    def check(self, cmd: str, topic: str, channel: str) -> None:
        """nsqd's ``CheckAuth`` for SUB, PUB, MPUB, DPUB."""
        if not self.enabled:
            return
        if not self.authed:
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        assert self.state is not None
        if self.state.expired(time.monotonic()):
            self.state = self._take_outcome(self.secret)
        if not self.state.allowed(topic, channel):
            raise ProtocolError("E_UNAUTHORIZED", f'AUTH failed for {cmd} on "{topic}" "{channel}"')

    def export(self) -> dict[str, Any] | None:
        """What another shard needs to carry this session on (a relayed connection)."""
        if self.state is None:
            return None
        st = self.state
        return {"secret": self.secret, "identity": st.identity, "identity_url": st.identity_url,
                "ttl_left": st.expires - time.monotonic(),
                "authorizations": [{"topic": a.topic.pattern, "channels": [c.pattern for c in a.channels],
                                    "permissions": sorted(a.permissions)} for a in st.authorizations]}

    def restore(self, data: dict[str, Any]) -> None:
        """The inverse of ``export``, in the shard the connection was relayed to (the auth
        server's verdict is not asked again until the same TTL runs out)."""
        self.secret = str(data["secret"])
        self.state = AuthState(
            identity=str(data["identity"]), identity_url=str(data["identity_url"]),
            expires=time.monotonic() + float(data["ttl_left"]),
            authorizations=[Authorization(re.compile(a["topic"]), [re.compile(c) for c in a["channels"]],
                                          frozenset(a["permissions"])) for a in data["authorizations"]])

    async def query(self, tls: bool, common_name: str) -> None:
        """Ask the auth servers (random start, round robin, first success wins) and keep
        the outcome for the command that raised ``NeedQuery``."""
        params = {"common_name": common_name, "remote_ip": self.remote_ip, "secret": self._querying,
                  "tls": "true" if tls else "false"}
        addresses = list(self.opts.auth_http_address)
        start = random.randrange(len(addresses))
        error = AuthError("no auth server")
        for addr in addresses[start:] + addresses[:start]:
            endpoint = addr if "://" in addr else f"http://{addr}/auth"
            try:
                body = await _request(endpoint, self.opts, params)
                self._outcome = AuthState.from_reply(body, time.monotonic())
                return
            except AuthError as exc:
                log.warning("auth: %s - %s", endpoint, exc)
                error = exc
        self._outcome = error


@functools.cache
def _client_context(root_ca_file: str) -> ssl.SSLContext:
    """HTTPS to auth servers trusts ``--tls-root-ca-file`` when given (as nsqd does)."""
    return ssl.create_default_context(cafile=root_ca_file or None)


async def _request(endpoint: str, opts: NsqdOptions, params: dict[str, str]) -> bytes:
    """The auth server's reply body. A plain-HTTP 403 naming an ``https_port`` (an nsq-style
    server with TLS required) is retried once over HTTPS on that port, as nsqd's client does.
    Raises ``AuthError``."""
    status, body = await _request_once(endpoint, opts, params)
    if status == b"403" and endpoint.startswith("http://"):
        try:
            https_port = int(orjson.loads(body)["https_port"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise AuthError(f"got response 403 {body[:100]!r}") from None
        url = urlsplit(endpoint)
        endpoint = url._replace(scheme="https", netloc=f"{url.hostname}:{https_port}").geturl()
        status, body = await _request_once(endpoint, opts, params)
    if status != b"200":
        raise AuthError(f"got response {status.decode(errors='replace')} {body[:100]!r}")
    return body


async def _request_once(endpoint: str, opts: NsqdOptions, params: dict[str, str]) -> tuple[bytes, bytes]:
    """One HTTP/1.0 request: ``(status code, body)``. Raises ``AuthError``."""
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise AuthError(f"bad auth server URL {endpoint!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    path = url.path or "/"
    headers = f"Host: {url.netloc}\r\nAccept: application/vnd.nsq; version=1.0\r\n"
    payload = b""
    if opts.auth_http_request_method == "post":
        payload = orjson.dumps({k: [v] for k, v in params.items()})
        target = path + (f"?{url.query}" if url.query else "")
        head = f"POST {target} HTTP/1.0\r\n{headers}Content-Type: application/json\r\n"
        head += f"Content-Length: {len(payload)}\r\n\r\n"
    else:
        query = "&".join(q for q in (url.query, urlencode(sorted(params.items()))) if q)
        head = f"GET {path}?{query} HTTP/1.0\r\n{headers}\r\n"
    context: Any = _client_context(opts.tls_root_ca_file) if url.scheme == "https" else None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(url.hostname, port, ssl=context), opts.http_client_connect_timeout / SECOND)
    except (OSError, TimeoutError) as exc:
        raise AuthError(f"connect failed: {exc!r}") from None
    try:
        writer.write(head.encode() + payload)
        raw = await asyncio.wait_for(reader.read(MAX_REPLY + 65536), opts.http_client_request_timeout / SECOND)
        while len(raw) <= MAX_REPLY + 65536:
            more = await asyncio.wait_for(reader.read(65536), opts.http_client_request_timeout / SECOND)
            if not more:
                break
            raw += more
    except (OSError, TimeoutError) as exc:
        raise AuthError(f"request failed: {exc!r}") from None
    finally:
        writer.close()
    status, _, rest = raw.partition(b"\r\n")
    parts = status.split(b" ")
    if len(parts) < 2 or not status.startswith(b"HTTP/"):
        raise AuthError(f"not an HTTP response: {status[:60]!r}")
    return parts[1], rest.partition(b"\r\n\r\n")[2]
