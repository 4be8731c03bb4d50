"""Shared fixtures: real daemons on free ports, torn down by pid; asyncio on uvloop.

Tiers (``scripts/test``): ``tests/unit`` holds tests that start no daemon (run with
pytest-xdist); the modules here start real daemons, and each declares its tier
(``tests/support/tiers.py``, whose collection hook this conftest uses): ``slow`` is the
integration tier; the rest, with ``tests/unit``, is the fast tier, run on every change
(``scripts/test fast``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.certs import Certs
from testbed.harness import STARTED, Daemon, remove_segments
from testbed.loop import run_async  # noqa: F401  (tests import it from here)
from tests.support.authserver import AuthServer
from tests.support.containers import (  # noqa: F401  (session fixtures: a Docker engine and pynsqd's images)
    broker_image,
    docker_engine,
    image_context,
    prometheus_image,
    spark_image,
)
from tests.support.foreign import clients  # noqa: F401  (the fixture: test_http, test_auth, the client tests)
from tests.support.tiers import pytest_collection_modifyitems  # noqa: F401  (the tier of every test module)

OUTPUT_TAIL = 60  # lines of each daemon's output shown with a failure


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    STARTED.clear()  # before the test's fixtures start their daemons


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test's report ends with what its daemons printed last (their logs are
    otherwise gone with their processes)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and call.when == "call":
        for daemon in STARTED:
            if daemon.proc is not None:
                tail = "\n".join(daemon.output.splitlines()[-OUTPUT_TAIL:])
                report.sections.append((f"output of {daemon.module} (pid {daemon.pid})", tail))


@pytest.fixture
def nsqd_factory(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start nsqd nodes: ``nsqd_factory("--mem-queue-size=10")`` → a started ``Daemon``."""
    started: list[Daemon] = []

    def make(*args: str, data_path: Path | None = None, start: bool = True,
             limits: dict[int, tuple[int, int]] | None = None) -> Daemon:
        path = data_path or tmp_path / f"nsqd{len(started)}"
        path.mkdir(parents=True, exist_ok=True)
        daemon = Daemon("pynsqd.supervisor", [
            "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
            f"--data-path={path}", "--log-level=debug", *args,
        ], listeners=("TCP", "HTTP"), limits=limits)
        started.append(daemon)
        return daemon.start() if start else daemon

    yield make
    for daemon in started:
        daemon.stop()
    remove_segments(started)


@pytest.fixture
def nsqd(nsqd_factory: Callable[..., Daemon]) -> Daemon:
    """One nsqd node with default options and two shards, whatever the host's CPU count."""
    return nsqd_factory("--shards=2")


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, server and client certificates made for this run (never committed)."""
    return Certs.make(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def auth() -> Iterator[AuthServer]:
    """A small real auth server (``tests.support.authserver``); set ``auth.replies[secret]``."""
    server = AuthServer().start()
    yield server
    server.stop()
