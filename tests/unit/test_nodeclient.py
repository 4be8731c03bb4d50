"""The load-test clients of ``tests/support/nodeclient.py`` clean up after a failing test:
a test that fails while its producer is connected reports that failure, not a loop that
cannot close (uvloop's EBUSY) or an unclosed transport warned about after the test."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from testbed.harness import scaled

ROOT = Path(__file__).resolve().parents[2]

FAILING = """
from tests.conftest import run_async
from tests.support.nodeclient import Consumer, Producer


def test_fails_before_closing() -> None:
    async def main() -> None:
        producer = Producer(("127.0.0.1", {port}))
        await producer.connect()
        Consumer(("127.0.0.1", {port}), "t", "c").start()
        assert False, "the test's own failure"

    run_async(main())
"""


def test_a_test_failing_with_a_producer_connected_reports_only_its_failure(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:  # a peer that accepts and says nothing
        test = tmp_path / "test_failing.py"
        test.write_text(FAILING.format(port=server.getsockname()[1]))
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"),
                               "--rootdir", str(ROOT), str(test)],
                              cwd=ROOT, capture_output=True, text=True, timeout=scaled(60))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "1 failed" in out and "AssertionError: the test's own failure" in out, out
    assert "ResourceWarning" not in out and "Errno 16" not in out and " error" not in out.split("\n")[-2], out
