"""pynsq (PyPI) and nsqjs (npm) over TLS, snappy, deflate and TLS + compression against the
real server: one client publishes, the other consumes every message and FINs it.

The nsqd arguments are a parameter (``NSQD_VARIANTS``) so the same tests run against other
process layouts; add ``["--shards", "2"]`` once the multi-shard supervisor accepts it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from testbed.certs import Certs
from testbed.harness import Daemon, wait_for
from tests.support.foreign import ClientProc, channel_stats, consume, publish

pytestmark = [pytest.mark.slow, pytest.mark.clients]

NSQD_VARIANTS = [pytest.param([], id="1shard")]

FEATURES = {
    "tls": ["--tls"],
    "snappy": ["--snappy"],
    "deflate": ["--deflate", "--deflate-level", "5"],
    "tls+snappy": ["--tls", "--snappy"],
    "tls+deflate": ["--tls", "--deflate"],
}


def client_args(feature: str, certs: Certs) -> list[str]:
    args = list(FEATURES[feature])
    if "--tls" in args:
        args += ["--ca", certs.ca_file]
    return args


def upgrades(feature: str) -> list[str]:
    return [{"tls": "TLS"}.get(part, part) for part in feature.split("+")]


@pytest.mark.parametrize("nsqd_args", NSQD_VARIANTS)
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize(("publisher", "consumer"), [("pynsq", "nsqjs"), ("nsqjs", "pynsq")])
def test_publish_and_consume_with_feature(nsqd_factory: Callable[..., Daemon], certs: Certs,
                                          clients: list[ClientProc], nsqd_args: list[str], feature: str,
                                          publisher: str, consumer: str) -> None:
    nsqd = nsqd_factory(*certs.server_args(*nsqd_args))
    extra = client_args(feature, certs)
    topic = f"feat-{feature.replace('+', '-')}"
    publish(clients, publisher, nsqd, topic, 200, *extra)
    publish(clients, publisher, nsqd, topic, 200, "--mpub", "50", "--prefix", "batch-", *extra)
    sub = consume(clients, consumer, nsqd, topic, "ch", 400, "--max-in-flight", "20", *extra)
    assert sub.finish() == 0, sub.err.decode()
    bodies = sorted(m["body"] for m in sub.messages())
    assert bodies == sorted([f"msg-{i}" for i in range(200)] + [f"batch-{i}" for i in range(200)])
    wait_for(lambda: channel_stats(nsqd, topic, "ch")["in_flight_count"] == 0)
    stats = channel_stats(nsqd, topic, "ch")
    assert stats["depth"] == 0 and stats["message_count"] == 400
    for name in upgrades(feature):  # two publishers and one consumer upgraded
        assert nsqd.output.count(f"upgrading connection to {name}") >= 3, nsqd.output[-3000:]


@pytest.mark.parametrize("kind", ["pynsq", "nsqjs"])
def test_client_certificate_required(nsqd_factory: Callable[..., Daemon], certs: Certs,
                                     clients: list[ClientProc], kind: str) -> None:
    nsqd = nsqd_factory(*certs.server_args("--tls-client-auth-policy=require-verify",
                                           f"--tls-root-ca-file={certs.ca_file}"))
    publish(clients, kind, nsqd, "mtls", 20, "--tls", "--ca", certs.ca_file, "--cert", certs.client_pem)
    sub = consume(clients, kind, nsqd, "mtls", "ch", 20, "--tls", "--ca", certs.ca_file,
                  "--cert", certs.client_pem)
    assert sub.finish() == 0, sub.err.decode()
    assert len(sub.messages()) == 20
