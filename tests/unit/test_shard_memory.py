"""A shard's malloc keeps large blocks for reuse (``pynsqd.shard.memory``): buffers of a 1 MiB
message allocated and freed again and again fault their pages in once, not every time."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

LOOP = """
import resource, sys
from pynsqd.shard.memory import keep_large_blocks
if sys.argv[1] == "tuned":
    assert keep_large_blocks()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # warm up
    bytes(bytearray(b"x" * (1 << 20)))
before = faults()
for i in range(200):
    data = bytearray(b"x" * (1 << 20))  # what parsing one 1 MiB message allocates
    body = bytes(memoryview(data)[4:])
    del data, body
print(faults() - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", LOOP, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the tuning is glibc's mallopt")
def test_large_buffers_are_reused_not_faulted_in_again() -> None:
    assert _faults("default") > 200 * 256  # each 1 MiB buffer's pages faulted in afresh
    assert _faults("tuned") < 1000
