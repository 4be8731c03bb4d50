"""AUTH against a real auth server (tests/support/authserver.py): grants, denials, expiry and
refresh, server failures, GET and POST, TLS common names; and the state alone."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pynsqd.shard.auth import AuthError, AuthState
from pynsqd.wire.commands import encode_auth, encode_dpub, encode_identify, encode_mpub, encode_pub, encode_sub
from testbed.certs import Certs
from testbed.harness import Daemon, wait_for
from tests.support.authserver import AuthServer, grant
from tests.support.foreign import ClientProc, consume, publish
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.fast

PUB_T = ("^t$", [".*"], ["publish"])
SUB_T = ("^t$", ["^ch$"], ["subscribe"])


@pytest.fixture
def authd(nsqd_factory: Callable[..., Daemon], auth: AuthServer) -> Daemon:
    return nsqd_factory(f"--auth-http-address={auth.address}")


def do_auth(c: RawClient, secret: str) -> dict[str, Any]:
    c.send(encode_auth(secret.encode()))
    return dict(json.loads(c.expect_response()))


# --- the state, alone ------------------------------------------------------------------------

def test_state_matches_unanchored_and_publish_needs_a_channel_matching_empty() -> None:
    state = AuthState.from_reply(json.dumps(grant(("t", ["c"], ["publish", "subscribe"]))[1]).encode(), 0)
    assert state.allowed("test", "xcx")  # unanchored, as Go's MatchString
    assert not state.allowed("test", "")  # publish: no channel regex matches ""
    state = AuthState.from_reply(json.dumps(grant(("^t$", [".*"], ["publish"]))[1]).encode(), 0)
    assert state.allowed("t", "") and not state.allowed("t", "ch") and not state.allowed("tt", "")


@pytest.mark.parametrize("reply", [
    {"ttl": 0, "authorizations": []},
    {"authorizations": []},
    {"ttl": 5, "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["admin"]}]},
    {"ttl": 5, "authorizations": [{"topic": "(", "channels": [".*"], "permissions": ["publish"]}]},
    {"ttl": "5"},
    [],
])
def test_state_refuses_bad_replies(reply: Any) -> None:
    with pytest.raises(AuthError):
        AuthState.from_reply(json.dumps(reply).encode(), 0)


def test_state_expires_after_ttl() -> None:
    state = AuthState.from_reply(json.dumps(grant(PUB_T, ttl=2)[1]).encode(), 100.0)
    assert not state.expired(101.9) and state.expired(102.0)


# --- the server ------------------------------------------------------------------------------

def test_auth_disabled_without_auth_servers(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        assert c.identify()["auth_required"] is False
        c.send(encode_auth(b"s"))
        c.expect_error("E_AUTH_DISABLED AUTH disabled")
        c.expect_closed()


@pytest.mark.parametrize(("wire", "cmd"), [
    (encode_pub("t", b"m"), "PUB"), (encode_sub("t", "ch"), "SUB"),
    (encode_mpub("t", [b"a"]), "MPUB"), (encode_dpub("t", 10, b"m"), "DPUB"),
])
def test_commands_before_auth_fail_with_auth_first(authd: Daemon, wire: bytes, cmd: str) -> None:
    with RawClient(authd.tcp) as c:
        assert c.identify()["auth_required"] is True
        c.send(wire)
        c.expect_error(f"E_AUTH_FIRST AUTH required before {cmd}")
        c.expect_closed()


def test_grant_then_permitted_and_denied_commands(authd: Daemon, auth: AuthServer) -> None:
    auth.replies["good"] = grant(PUB_T, SUB_T, identity="alice", identity_url="http://id/alice")
    with RawClient(authd.tcp) as c:
        assert do_auth(c, "good") == {"identity": "alice", "identity_url": "http://id/alice",
                                      "permission_count": 2}
        c.send(encode_pub("t", b"m"))
        c.expect_ok()
        c.send(encode_auth(b"good"))
        c.expect_error("E_INVALID AUTH already set")
        c.expect_closed()
    [req] = auth.requests
    assert req["method"] == "GET" and req["path"] == "/auth"
    assert req["params"] == {"common_name": [""], "remote_ip": ["127.0.0.1"], "secret": ["good"],
                             "tls": ["false"]}
    assert req["accept"] == "application/vnd.nsq; version=1.0"
    with RawClient(authd.tcp) as c:
        do_auth(c, "good")
        c.send(encode_sub("t", "ch"))
        c.expect_ok()
        stats = httpx.get(f"{authd.http_url}/stats", params={"format": "json"}, timeout=5).json()
        [client] = stats["topics"][0]["channels"][0]["clients"]
        assert (client["authed"], client["auth_identity"], client["auth_identity_url"]) == (
            True, "alice", "http://id/alice")
    for wire, text in [(encode_pub("other", b"m"), 'AUTH failed for PUB on "other" ""'),
                       (encode_sub("t", "other"), 'AUTH failed for SUB on "t" "other"'),
                       (encode_mpub("u", [b"m"]), 'AUTH failed for MPUB on "u" ""')]:
        with RawClient(authd.tcp) as c:
            do_auth(c, "good")
            c.send(wire)
            c.expect_error(f"E_UNAUTHORIZED {text}")
            c.expect_closed()


def test_denied_and_empty_and_broken_replies(authd: Daemon, auth: AuthServer) -> None:
    auth.replies["none"] = grant(ttl=1)
    auth.replies["bad"] = (200, b"{not json")
    auth.replies["oops"] = (500, {"message": "boom"})
    with RawClient(authd.tcp) as c:
        c.send(encode_auth(b"none"))
        c.expect_error("E_UNAUTHORIZED AUTH no authorizations found")
        c.expect_closed()
    for secret in ("unknown", "bad", "oops"):  # 403, unparsable, 500: never leaked to the client
        with RawClient(authd.tcp) as c:
            c.send(encode_auth(secret.encode()))
            c.expect_error("E_AUTH_FAILED AUTH failed")
            c.expect_closed()
    with RawClient(authd.tcp) as c:
        c.send(b"AUTH extra\n" + encode_auth(b"x")[5:])
        c.expect_error("E_INVALID AUTH invalid number of parameters")


def test_expiry_requeries_and_applies_the_new_answer(authd: Daemon, auth: AuthServer) -> None:
    auth.replies["s"] = grant(PUB_T, ttl=1)
    with RawClient(authd.tcp) as c:
        do_auth(c, "s")
        c.send(encode_pub("t", b"1"))
        c.expect_ok()
        assert len(auth.requests) == 1  # cached within the TTL

        def refreshed() -> bool:
            c.send(encode_pub("t", b"again"))
            c.expect_ok()
            return len(auth.requests) == 2
        wait_for(refreshed, timeout=5, interval=0.1)
        auth.replies["s"] = grant(("^elsewhere$", [".*"], ["publish"]), ttl=1)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            c.send(encode_pub("t", b"later"))
            frame_type, data = c.read_frame()
            if frame_type == 1:
                assert data == b'E_UNAUTHORIZED AUTH failed for PUB on "t" ""'
                break
        else:
            raise AssertionError("the refreshed denial never arrived")
        c.expect_closed()


def test_expiry_with_the_auth_server_failing_is_auth_failed(authd: Daemon, auth: AuthServer) -> None:
    auth.replies["s"] = grant(PUB_T, ttl=1)
    with RawClient(authd.tcp) as c:
        do_auth(c, "s")
        auth.replies["s"] = (500, {"message": "down"})
        end = time.monotonic() + 5
        while time.monotonic() < end:
            c.send(encode_pub("t", b"m"))
            frame_type, data = c.read_frame()
            if frame_type == 1:
                assert data == b"E_AUTH_FAILED AUTH failed"
                break
        else:
            raise AssertionError("the failed refresh never arrived")
        c.expect_closed()


def test_post_method_and_several_servers(nsqd_factory: Callable[..., Daemon], auth: AuthServer) -> None:
    dead = "127.0.0.1:1"  # nothing listens there: the next server is asked
    nsqd = nsqd_factory(f"--auth-http-address={dead}", f"--auth-http-address=http://{auth.address}/auth",
                        "--auth-http-request-method=post")
    auth.replies["p"] = grant(PUB_T)
    with RawClient(nsqd.tcp) as c:
        assert do_auth(c, "p")["permission_count"] == 1
    req = auth.requests[-1]
    assert req["method"] == "POST" and req["content_type"] == "application/json"
    assert req["params"] == {"common_name": [""], "remote_ip": ["127.0.0.1"], "secret": ["p"], "tls": ["false"]}


def test_tls_client_certificate_common_name(nsqd_factory: Callable[..., Daemon], auth: AuthServer,
                                            certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args(f"--tls-root-ca-file={certs.ca_file}"),
                        f"--auth-http-address={auth.address}")
    auth.replies["t"] = grant(PUB_T)
    with RawClient(nsqd.tcp) as c:
        c.send(encode_identify(json.dumps({"feature_negotiation": True, "tls_v1": True}).encode()))
        c.expect_response()
        c.start_tls(certs.client_context("client"))
        c.expect_ok()
        do_auth(c, "t")
        c.send(encode_pub("t", b"m"))
        c.expect_ok()
    assert auth.requests[-1]["params"]["common_name"] == ["test-client"]
    assert auth.requests[-1]["params"]["tls"] == ["true"]


@pytest.mark.clients
@pytest.mark.parametrize("kind", ["pynsq", "nsqjs"])
def test_external_clients_with_auth_secret(authd: Daemon, auth: AuthServer, clients: list[ClientProc],
                                           kind: str) -> None:
    auth.replies["cs"] = grant(PUB_T, SUB_T)
    publish(clients, kind, authd, "t", 10, "--auth-secret", "cs")
    sub = consume(clients, kind, authd, "t", "ch", 10, "--auth-secret", "cs")
    assert sub.finish() == 0, sub.err.decode()
    assert len(sub.messages()) == 10


def test_403_with_https_port_is_retried_over_https(nsqd_factory: Callable[..., Daemon], auth: AuthServer,
                                                   certs: Certs) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    secure = AuthServer(ctx).start()
    try:
        secure.replies["s"] = grant(PUB_T, identity="via-https")
        auth.replies["s"] = (403, {"message": "TLS_REQUIRED", "https_port": int(secure.address.split(":")[1])})
        nsqd = nsqd_factory(f"--auth-http-address={auth.address}", f"--tls-root-ca-file={certs.ca_file}")
        with RawClient(nsqd.tcp) as c:
            assert do_auth(c, "s")["identity"] == "via-https"
        assert len(auth.requests) == 1 and len(secure.requests) == 1
    finally:
        secure.stop()
