"""TLS, snappy and deflate negotiation on the wire, frame by frame, against the real server
(nsqd's protocol_v2_test TestTLS*, TestDeflate, TestSnappy and their edge cases)."""

from __future__ import annotations

import json
import select
import ssl
import zlib
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pynsqd.wire.commands import encode_identify, encode_pub, encode_rdy, encode_sub
from pynsqd.wire.compression import DeflateCodec, SnappyCodec
from pynsqd.wire.frames import FRAME_RESPONSE
from testbed.certs import Certs
from testbed.harness import Daemon
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.fast


def client_stats(nsqd: Daemon) -> list[dict[str, Any]]:
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json"}, timeout=5).json()
    return [c for t in data["topics"] for ch in t["channels"] for c in ch["clients"]]


def roundtrip(c: RawClient, topic: str, body: bytes) -> None:
    c.send(encode_pub(topic, body))
    c.expect_ok()
    c.send(encode_sub(topic, "ch"))
    c.expect_ok()
    c.send(encode_rdy(1))
    assert c.read_message().body == body


def test_tls_upgrade_then_ok_then_pub_sub(nsqd_factory: Callable[..., Daemon], certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args())
    with RawClient(nsqd.tcp) as c:
        resp = c.identify(tls_v1=True)
        assert resp["tls_v1"] is True and resp["snappy"] is False and resp["deflate"] is False
        c.start_tls(certs.client_context())
        c.expect_ok()
        roundtrip(c, "tls", b"secret" * 100)
        [stats] = client_stats(nsqd)
        assert stats["tls"] is True and stats["tls_version"].startswith("TLS1.")
        assert stats["tls_cipher_suite"] and stats["snappy"] is False


def test_tls_not_offered_without_a_certificate(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        assert c.identify(tls_v1=True)["tls_v1"] is False
        roundtrip(c, "plain", b"x")


@pytest.mark.parametrize("name", ["snappy", "deflate"])
def test_compression_round_trips_a_large_message(nsqd_factory: Callable[..., Daemon], name: str) -> None:
    nsqd = nsqd_factory()
    with RawClient(nsqd.tcp) as c:
        resp = c.identify(**{name: True})
        assert resp[name] is True
        c.start_compression(name, resp["deflate_level"])
        c.expect_ok()
        body = bytes(range(256)) * 512  # 128 KiB, as nsqd's TestSnappy
        roundtrip(c, f"z-{name}", body)
        [stats] = client_stats(nsqd)
        assert stats[name] is True and stats["tls"] is False


def test_deflate_ok_is_readable_by_a_plain_inflater_and_level_is_capped(
        nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-deflate-level=3")
    with RawClient(nsqd.tcp) as c:
        resp = c.identify(deflate=True, deflate_level=9)
        assert (resp["deflate"], resp["deflate_level"], resp["max_deflate_level"]) == (True, 3, 3)
        c.sock.settimeout(5)
        raw = c.sock.recv(1024)
        assert zlib.decompressobj(-15).decompress(raw) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


def test_default_deflate_level_and_level_ignored_without_deflate(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        resp = c.identify(deflate_level=2)
        assert (resp["deflate"], resp["deflate_level"]) == (False, 6)


@pytest.mark.parametrize("name", ["snappy", "deflate"])
def test_tls_then_compression_each_followed_by_ok(nsqd_factory: Callable[..., Daemon], certs: Certs,
                                                  name: str) -> None:
    nsqd = nsqd_factory(*certs.server_args())
    with RawClient(nsqd.tcp) as c:
        resp = c.identify(tls_v1=True, **{name: True})
        assert resp["tls_v1"] is True and resp[name] is True
        c.start_tls(certs.client_context())
        c.expect_ok()
        c.start_compression(name)
        c.expect_ok()
        roundtrip(c, f"tz-{name}", b"both" * 5000)
        [stats] = client_stats(nsqd)
        assert stats["tls"] is True and stats[name] is True


def test_snappy_and_deflate_together_fail(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.send(encode_identify(json.dumps({"feature_negotiation": True, "snappy": True,
                                           "deflate": True}).encode()))
        c.expect_error("E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
        c.expect_closed()


@pytest.mark.parametrize("flag", ["--snappy=false", "--deflate=false"])
def test_disabled_compression_is_not_negotiated(nsqd_factory: Callable[..., Daemon], flag: str) -> None:
    name = flag[2:].split("=")[0]
    nsqd = nsqd_factory(flag)
    with RawClient(nsqd.tcp) as c:
        assert c.identify(**{name: True})[name] is False
        roundtrip(c, "nocomp", b"plain")


def test_without_feature_negotiation_nothing_is_upgraded(nsqd_factory: Callable[..., Daemon],
                                                         certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args())
    with RawClient(nsqd.tcp) as c:
        c.send(encode_identify(json.dumps({"tls_v1": True, "snappy": True}).encode()))
        c.expect_ok()
        roundtrip(c, "nofn", b"plain")


def test_bytes_sent_before_the_upgrade_completes_are_refused(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.send(encode_identify(json.dumps({"feature_negotiation": True, "snappy": True}).encode())
               + b"NOP\n")
        c.expect_error("E_IDENTIFY_FAILED IDENTIFY failed data sent before the upgrade completed")
        c.expect_closed()


def test_a_second_compression_upgrade_is_refused(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.identify(snappy=True)
        c.start_compression("snappy")
        c.expect_ok()
        c.send(encode_identify(json.dumps({"feature_negotiation": True, "snappy": True}).encode()))
        c.expect_error("E_IDENTIFY_FAILED IDENTIFY failed connection already upgraded")
        c.expect_closed()


@pytest.mark.parametrize("name", ["snappy", "deflate"])
def test_corrupt_compressed_stream_closes_the_connection(nsqd: Daemon, name: str) -> None:
    with RawClient(nsqd.tcp) as c:
        c.identify(**{name: True})
        codec = SnappyCodec() if name == "snappy" else DeflateCodec()
        c.sock.settimeout(5)
        assert b"".join(codec.decode(c.sock.recv(1024))).endswith(b"OK")
        c.sock.sendall(b"\x00\x10\x00\x00garbage-garbage!" if name == "snappy" else b"\xff" * 64)
        c.expect_closed()
    assert nsqd.wait_for_log("failed to read command")


def test_failed_handshake_closes_only_that_connection(nsqd_factory: Callable[..., Daemon],
                                                      certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args())
    with RawClient(nsqd.tcp) as c:
        c.identify(tls_v1=True)
        c.send(b"this is not a TLS client hello\r\n" * 4)
        c.expect_closed()
    with RawClient(nsqd.tcp) as c:
        c.identify(tls_v1=True)
        c.start_tls(certs.client_context())
        c.expect_ok()


@pytest.mark.parametrize("mode", ["true", "tcp-https"])
def test_tls_required_refuses_plaintext_commands(nsqd_factory: Callable[..., Daemon], certs: Certs,
                                                 mode: str) -> None:
    nsqd = nsqd_factory(*certs.server_args(f"--tls-required={mode}"))
    for cmd, wire in [("PUB", encode_pub("t", b"m")), ("SUB", encode_sub("t", "c")), ("NOP", b"NOP\n"),
                      ("BOGUS", b"BOGUS\n")]:
        with RawClient(nsqd.tcp) as c:
            c.identify()  # IDENTIFY itself is allowed
            c.send(wire)
            c.expect_error(f"E_INVALID cannot {cmd} in current state (TLS required)")
            c.expect_closed()
    with RawClient(nsqd.tcp) as c:
        c.identify(tls_v1=True)
        c.start_tls(certs.client_context())
        c.expect_ok()
        roundtrip(c, "t", b"m")


@pytest.mark.parametrize("policy", ["require", "require-verify"])
def test_client_certificate_policy(nsqd_factory: Callable[..., Daemon], certs: Certs, policy: str) -> None:
    nsqd = nsqd_factory(*certs.server_args(f"--tls-client-auth-policy={policy}",
                                           f"--tls-root-ca-file={certs.ca_file}"))
    # nsqd's "require" takes any certificate; Python's ssl verifies every certificate it
    # accepts, so here "require" refuses a stranger's too (see node/tls.build_server_context).
    for cert in ("", "stranger"):  # no certificate, and one from a CA the server does not trust
        with RawClient(nsqd.tcp) as c:
            c.identify(tls_v1=True)
            with pytest.raises((ssl.SSLError, ConnectionError)):
                c.start_tls(certs.client_context(cert))
                c.expect_ok()  # TLS 1.3 reports a rejected client certificate on first read
    with RawClient(nsqd.tcp) as c:
        c.identify(tls_v1=True)
        c.start_tls(certs.client_context("client"))
        c.expect_ok()
        roundtrip(c, "mtls", b"m")


def test_tls_min_version_refuses_older_clients(nsqd_factory: Callable[..., Daemon], certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args("--tls-min-version=tls1.3"))
    ctx = certs.client_context()
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with RawClient(nsqd.tcp) as c:
        c.identify(tls_v1=True)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            c.start_tls(ctx)
    with RawClient(nsqd.tcp) as c:
        c.identify(tls_v1=True)
        c.start_tls(certs.client_context())
        c.expect_ok()
        roundtrip(c, "v13", b"m")
        [stats] = client_stats(nsqd)
        assert stats["tls_version"] == "TLS1.3"


def test_heartbeat_due_during_the_handshake_is_held_until_after_ok(nsqd_factory: Callable[..., Daemon],
                                                                    certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args())
    with RawClient(nsqd.tcp) as c:
        c.identify(tls_v1=True, heartbeat_interval=1000)
        # a heartbeat falls due at 1s; in the clear it would break the handshake
        readable, _, _ = select.select([c.sock], [], [], 1.2)
        assert not readable
        c.start_tls(certs.client_context())
        assert c.read_frame(skip_heartbeats=False) == (FRAME_RESPONSE, b"OK")
        assert c.read_frame(skip_heartbeats=False) == (FRAME_RESPONSE, b"_heartbeat_")
        c.send(b"NOP\n")
        roundtrip(c, "hb", b"m")
