"""Drive ``wrk`` (the C HTTP load generator, Debian package ``wrk``) for one bench phase.

``bench_http.py`` has its own load generator in Python; wrk is the standard tool for the job,
a cross-check that the figure is the server's and not our generator's. Both print their own
CPU per request; on either side most of a request is the kernel's send, receive and wake-up,
so the C tool saves little CPU. It keeps one request outstanding per connection (no pipelining), like the Python
generator and like a client that waits for ``OK``.

``run`` writes a Lua script that makes every request a POST of the given body (and prints the
99.9th percentile when done), runs wrk, and parses its report (``--latency`` adds the
percentile table). The CPU wrk used comes from ``wait4``'s rusage. Any non-2xx answer or
socket error fails the phase: a fast error is not a publish.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


@dataclass
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_s: float
    p999_ms: float = float("nan")


def available() -> bool:
    return shutil.which("wrk") is not None


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)([a-z]+)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def parse(report: str) -> tuple[int, float, float, float]:
    """(requests, seconds, p50 ms, p99 ms) from wrk's report; ValueError on errors in it."""
    done = re.search(r"^\s*(\d+) requests in ([0-9.]+)(\w+),", report, re.M)
    p50 = re.search(r"^\s*50%\s+(\S+)\s*$", report, re.M)  # wrk pads "1.68s " to its column
    p99 = re.search(r"^\s*99%\s+(\S+)\s*$", report, re.M)
    if not (done and p50 and p99):
        raise ValueError(f"unexpected wrk report:\n{report}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", report)
    errors = re.search(r"Socket errors: (.*)", report)
    if bad or errors:
        raise ValueError(f"wrk saw failures: {(bad or errors).group(0)}")  # type: ignore[union-attr]
    seconds = _ms(done.group(2) + done.group(3)) / 1e3
    return int(done.group(1)), seconds, _ms(p50.group(1)), _ms(p99.group(1))


def run(url: str, body: bytes, connections: int, threads: int, seconds: float) -> WrkResult:
    with tempfile.TemporaryDirectory() as tmp:
        body_file = os.path.join(tmp, "body")
        with open(body_file, "wb") as f:
            f.write(body)
        script = os.path.join(tmp, "post.lua")
        with open(script, "w") as f:
            f.write('wrk.method = "POST"\n'
                    f'local f = io.open("{body_file}", "rb")\n'
                    'wrk.body = f:read("*a")\nf:close()\n'
                    'wrk.headers["Content-Type"] = "application/octet-stream"\n'
                    'done = function(summary, latency, requests)\n'
                    '  io.write(string.format("p99.9 %dus\\n", latency:percentile(99.9)))\nend\n')
        proc = subprocess.Popen(["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency",
                                 "-s", script, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise ValueError(f"wrk exited {proc.returncode}:\n{out}")
    requests, took, p50, p99 = parse(out)
    p999 = re.search(r"^p99\.9 (\S+)$", out, re.M)
    return WrkResult(requests, took, p50, p99, usage.ru_utime + usage.ru_stime,
                     _ms(p999.group(1)) if p999 else float("nan"))
