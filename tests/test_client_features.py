"""pynsqd.client's TLS, snappy, deflate and AUTH against the real server (and the codec switch
in the middle of a segment against a scripted one); the utilities' go-nsq TLS/AUTH options."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pynsqd.client import (
    ConnectError,
    Consumer,
    Message,
    Producer,
    ResponseError,
    SyncProducer,
    TLSOptions,
    TransportError,
)
from testbed.certs import Certs
from testbed.harness import Daemon, scaled
from tests.conftest import run_async
from tests.support.authserver import AuthServer, grant
from tests.support.fake_nsqd import FakeNsqd
from tests.test_client_library import tcp, until
from tests.test_features_wire import client_stats
from tests.test_tools import procs, start  # noqa: F401  (procs: the fixture)

pytestmark = pytest.mark.slow

N = 300
FEATURES: dict[str, dict[str, Any]] = {
    "snappy": {"snappy": True}, "deflate": {"deflate": True, "deflate_level": 9}, "tls": {"tls_v1": True},
    "tls+snappy": {"tls_v1": True, "snappy": True}, "tls+deflate": {"tls_v1": True, "deflate": True},
}


def negotiated(stats: dict[str, Any]) -> dict[str, bool]:
    return {"tls": stats["tls"], "snappy": stats["snappy"], "deflate": stats["deflate"]}


async def publish_and_consume(nsqd: Daemon, topic: str, n: int = N, stats: bool = True,
                              **options: Any) -> list[dict[str, Any]]:
    """Publish ``n`` messages (PUB, pipelined, plus one MPUB) and consume them all with the same
    options; return nsqd's client stats for the producer (connected) and the consumer (read
    over plain HTTP, so only when ``stats``)."""
    bodies = [b"%s-%d-" % (topic.encode(), i) * 40 for i in range(n)]
    found: list[dict[str, Any]] = []
    async with Producer(tcp(nsqd), **options) as p:
        await asyncio.gather(*(p.publish(topic, b) for b in bodies[:-10]))
        await p.multi_publish(topic, bodies[-10:])
        if stats:
            found += [c for c in await asyncio.to_thread(client_stats_all, nsqd) if c.get("pub_counts")]
    got: list[bytes] = []
    c = Consumer(topic, "ch", lambda m: got.append(m.body), nsqd_tcp_addresses=[tcp(nsqd)],
                 max_in_flight=50, **options)
    await c.start()
    try:
        await until(lambda: len(got) == n, what=f"{n} messages")
        if stats:
            found += await asyncio.to_thread(client_stats, nsqd)
    finally:
        await c.stop()
    assert sorted(got) == sorted(bodies)
    assert len(found) == (2 if stats else 0)
    return found


def client_stats_all(nsqd: Daemon) -> list[dict[str, Any]]:
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json"}, timeout=5).json()
    return list(data.get("producers") or []) + client_stats(nsqd)


@pytest.fixture
def tls_nsqd(nsqd_factory: Callable[..., Daemon], certs: Certs) -> Daemon:
    return nsqd_factory(*certs.server_args())


def test_every_feature_publishes_and_consumes(tls_nsqd: Daemon, certs: Certs) -> None:
    async def main() -> None:
        for name, options in FEATURES.items():
            if options.get("tls_v1"):
                options = {**options, "tls_options": TLSOptions(root_ca_file=certs.ca_file)}
            for stats in await publish_and_consume(tls_nsqd, name.replace("+", "-"), **options):
                assert negotiated(stats) == {"tls": "tls" in name, "snappy": "snappy" in name,
                                             "deflate": "deflate" in name}, name
    run_async(main())


@pytest.mark.parametrize("name", ["snappy", "deflate"])
def test_codec_switch_in_the_middle_of_a_segment(name: str) -> None:
    """The IDENTIFY reply, the compressed OK and a compressed heartbeat arrive in one write."""
    async def main() -> None:
        fake = FakeNsqd(settings={"max_rdy_count": 2500, "version": "1.3.0", name: True, "deflate_level": 6})
        address = await fake.start()
        try:
            async with Producer(address, **{name: True}) as p:
                await until(lambda: b"NOP" in fake.names(), what="NOP for the heartbeat")
                await p.publish("t", b"compressed")
            assert fake.names() == [b"IDENTIFY", b"NOP", b"PUB"]
            assert fake.commands[-1][2] == b"compressed"
        finally:
            await fake.close()
    run_async(main())


def test_server_certificate_checks(tls_nsqd: Daemon, certs: Certs) -> None:
    async def main() -> None:
        with pytest.raises(TransportError, match=r"TLS handshake .* failed.*CERTIFICATE_VERIFY_FAILED"):
            await Producer(tcp(tls_nsqd), tls_v1=True, connect_timeout=scaled(5)).connect()  # system CAs only
        with pytest.raises(TransportError, match="TLS handshake"):  # the certificate names 127.0.0.1
            await Producer(tcp(tls_nsqd), tls_v1=True, tls_options=TLSOptions(
                root_ca_file=certs.ca_file, server_name="nsqd.example.com")).connect()
        async with Producer(tcp(tls_nsqd), tls_v1=True,
                            tls_options=TLSOptions(insecure_skip_verify=True, min_version="tls1.2")) as p:
            await p.publish("skip", b"x")
            assert p.settings["tls_v1"] is True
        async with Producer(tcp(tls_nsqd), tls_v1=True, tls_options=certs.client_context()) as p:
            await p.publish("ctx", b"x")  # an SSLContext of the caller's
    run_async(main())


def test_tls_asked_of_a_server_without_a_certificate_stays_plain(nsqd: Daemon) -> None:
    async def main() -> None:
        async with Producer(tcp(nsqd), tls_v1=True, snappy=True) as p:
            await p.publish("t", b"x")
            assert (p.settings["tls_v1"], p.settings["snappy"]) == (False, True)
    run_async(main())
    with SyncProducer(tcp(nsqd), deflate=True, deflate_level=1) as sp:  # the blocking facade too
        sp.multi_publish("t", [b"y", b"z"])
    assert channel_depth(nsqd, "t") == 3


def channel_depth(nsqd: Daemon, topic: str) -> int:
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json", "topic": topic}, timeout=5).json()
    return int(data["topics"][0]["depth"])


def test_client_certificate_required_and_verified(nsqd_factory: Callable[..., Daemon], certs: Certs,
                                                  auth: AuthServer) -> None:
    nsqd = nsqd_factory(*certs.server_args("--tls-client-auth-policy=require-verify",
                                           f"--tls-root-ca-file={certs.ca_file}",
                                           f"--auth-http-address={auth.address}"))
    auth.replies["s"] = grant(("^cert$", [".*"], ["publish", "subscribe"]), identity="cert-user")

    def opts(cert: str) -> dict[str, Any]:
        return {"tls_v1": True, "auth_secret": "s", "connect_timeout": scaled(5),
                "tls_options": TLSOptions(root_ca_file=certs.ca_file, cert=cert, key=cert)}

    async def main() -> None:
        for cert in ("", certs.stranger_pem):  # no certificate, or one from an unknown CA
            p = Producer(tcp(nsqd), **opts(cert))
            with pytest.raises(ConnectError, match="closed the connection after the TLS handshake"):
                await p.publish("cert", b"x")
            await p.close()
        # (the client-auth policy makes nsqd refuse plain HTTP: no /stats here; the auth
        # server's requests show the TLS connections and the certificate's common name)
        await publish_and_consume(nsqd, "cert", 50, stats=False, **opts(certs.client_pem))
        assert len(auth.requests) == 2
        assert {tuple(r["params"]["common_name"]) for r in auth.requests} == {("test-client",)}
        assert {tuple(r["params"]["tls"]) for r in auth.requests} == {("true",)}
    run_async(main())


def test_auth_granted_and_denied(nsqd_factory: Callable[..., Daemon], auth: AuthServer) -> None:
    nsqd = nsqd_factory(f"--auth-http-address={auth.address}")
    auth.replies["good"] = grant(("^t$", [".*"], ["publish"]), ("^t$", ["^ch$"], ["subscribe"]),
                                 identity="alice", identity_url="http://id/alice")
    auth.replies["nothing"] = grant()

    async def main() -> None:
        for secret, code in (("wrong", "E_AUTH_FAILED"), ("nothing", "E_UNAUTHORIZED"), ("", "E_AUTH_FIRST")):
            p = Producer(tcp(nsqd), auth_secret=secret)
            with pytest.raises(ResponseError) as err:
                await p.publish("t", b"x")
            assert err.value.code == code
            await p.close()
        async with Producer(tcp(nsqd), auth_secret="good", snappy=True) as p:
            await p.publish("t", b"allowed")
            assert p.auth == {"identity": "alice", "identity_url": "http://id/alice", "permission_count": 2}
            with pytest.raises(ResponseError) as err:
                await p.publish("other", b"x")  # authenticated, not authorized
            assert err.value.code == "E_UNAUTHORIZED"
        got: list[Message] = []
        denied = Consumer("t", "ch", got.append, nsqd_tcp_addresses=[tcp(nsqd)], auth_secret="wrong",
                          reconnect_interval=60)
        await denied.start()
        assert not denied.conns and denied.stats["connects"] == 0
        await denied.stop()
        c = Consumer("t", "ch", got.append, nsqd_tcp_addresses=[tcp(nsqd)], auth_secret=b"good", deflate=True)
        await c.start()
        try:
            await until(lambda: len(got) == 1)
            assert got[0].body == b"allowed"
            [conn] = c.conns.values()
            assert conn.proto.auth is not None and conn.proto.auth["identity"] == "alice"
        finally:
            await c.stop()
    run_async(main())


def test_utilities_take_tls_compression_and_auth_options(nsqd_factory: Callable[..., Daemon], certs: Certs,
                                                        auth: AuthServer,
                                                        procs: list[subprocess.Popen[bytes]]) -> None:  # noqa: F811
    nsqd = nsqd_factory(*certs.server_args("--tls-required=true", f"--auth-http-address={auth.address}"))
    auth.replies["tool"] = grant(("^lines$", [".*"], ["publish", "subscribe"]))
    address = f"--nsqd-tcp-address=127.0.0.1:{nsqd.tcp[1]}"
    tls = ["tls_v1,true", f"tls_root_ca_file,{certs.ca_file}", "auth_secret,tool"]
    lines = [b"line %d" % i for i in range(200)]
    pub = start(procs, "to_nsq", "--topic=lines", address, "--rate=0",
                *[f"--producer-opt={o}" for o in [*tls, "deflate,true", "deflate_level,3"]], stdin=subprocess.PIPE)
    out, err = pub.communicate(b"\n".join(lines) + b"\n", timeout=scaled(30))
    assert pub.returncode == 0, err
    tail = start(procs, "nsq_tail", "--topic=lines", "--channel=c", address, f"-n={len(lines)}",
                 *[f"--consumer-opt={o}" for o in [*tls, "snappy"]])
    out, err = tail.communicate(timeout=scaled(30))
    assert tail.returncode == 0, err
    assert out.splitlines() == lines
    plain = start(procs, "to_nsq", "--topic=lines", address, "--producer-opt=auth_secret,tool", stdin=subprocess.PIPE)
    out, err = plain.communicate(b"x\n", timeout=scaled(30))
    assert plain.returncode == 1 and "TLS required" in err.decode()  # the server really demands TLS
    bad = start(procs, "nsq_tail", "--topic=lines", address, "--consumer-opt=tls_v1,true",
                "--consumer-opt=tls_root_ca_file,/nonexistent.pem")
    out, err = bad.communicate(timeout=scaled(30))
    assert bad.returncode == 1 and err.decode().count("\n") == 1 and "tls_root_ca_file" in err.decode()
