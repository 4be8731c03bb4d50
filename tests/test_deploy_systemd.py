"""deploy/systemd: the units pass systemd's own checks, and the node does what they promise.

- ``systemd-analyze verify`` accepts every unit (no warning at all), in a scratch root laid out
  as the units expect (``/opt/pynsqd/bin/…`` executable);
- ``systemd-analyze security --offline`` rates each unit's sandbox "OK" (exposure ≤ 2.0);
- ``systemd-sysusers`` creates the ``nsq`` system user from ``pynsqd.sysusers``;
- ``Type=notify``: a real node tells a real ``NOTIFY_SOCKET`` (a unix datagram socket, path or
  abstract) ``READY=1`` once it serves and ``STOPPING=1`` when it stops, from the supervisor's
  own pid (``NotifyAccess=main``);
- ``SystemCallFilter=``/``RestrictAddressFamilies=``: every system call and socket family a
  real node makes while it publishes, delivers over two shards and stops (``strace -f``) is
  one the unit allows, so the sandbox still lets it run;
- and the units under systemd itself (Debian's, booted in a container on the Docker engine of
  ``tests/support/containers.py``): they start (``Type=notify``), serve as ``nsq``, survive a kill -9
  of the node with its queues, and stop cleanly.
"""

from __future__ import annotations

import array
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from testbed.harness import Daemon, remove_segments, scaled, wait_for
from tests.support.containers import BASE_IMAGE, PREFIX, Engine
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
UNIT_NAMES = ["nsqd-supervisor.service", "nsqlookupd.service", "nsqadmin.service"]

needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze not installed (Debian package systemd)")


def unit_root(tmp_path: Path) -> Path:
    """A filesystem root with systemd's own units, ours, and the commands they run."""
    root = tmp_path / "root"
    system_units = next(p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir())
    shutil.copytree(system_units, root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for name in UNIT_NAMES:
        shutil.copy(UNITS / name, root / "etc/systemd/system" / name)
    (root / "bin").mkdir()
    kill = shutil.which("kill")  # ExecReload's
    assert kill is not None
    shutil.copy(kill, root / "bin/kill")
    bin_dir = root / "opt/pynsqd/bin"
    bin_dir.mkdir(parents=True)
    for command in ("nsqd-supervisor", "nsqlookupd", "nsqadmin"):
        script = bin_dir / command
        script.write_text(f"#!/bin/sh\nexec {Path(sys.executable).parent / command} \"$@\"\n")
        script.chmod(0o755)
    return root


def service(name: str) -> dict[str, list[str]]:
    """The unit's ``[Service]`` settings: key → every value given, in order (systemd reads a
    repeated key as more of the same list, or as the last value for a single one)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in (UNITS / name).read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def last(unit: dict[str, list[str]], key: str) -> str:
    return unit[key][-1]


@needs_systemd
def test_systemd_analyze_verify_accepts_every_unit(tmp_path: Path) -> None:
    root = unit_root(tmp_path)
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", *UNIT_NAMES],
                          capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr
    # the check is real: a broken copy is reported
    broken = root / "etc/systemd/system/nsqadmin.service"
    broken.write_text(broken.read_text().replace("Type=exec", "Type=sometimes"))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", "nsqadmin.service"],
                          capture_output=True, text=True, timeout=scaled(60))
    assert "Failed to parse service type" in done.stderr


@needs_systemd
@pytest.mark.parametrize("name", UNIT_NAMES)
def test_systemd_analyze_security_rates_the_sandbox_ok(tmp_path: Path, name: str) -> None:
    root = unit_root(tmp_path)
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", f"--root={root}", "--threshold=20",
                           "--no-pager", name], capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    level = re.search(r"Overall exposure level for \S+: ([\d.]+) OK", done.stdout)
    assert level is not None and float(level.group(1)) <= 2.0, done.stdout[-500:]


def test_stop_timeout_exceeds_the_shutdown_deadline() -> None:
    from pynsqd.supervisor.arbiter import SHUTDOWN_DEADLINE
    unit = service("nsqd-supervisor.service")
    assert unit["Environment"] == [f"PYNSQD_SHUTDOWN_DEADLINE={SHUTDOWN_DEADLINE:g}"]
    assert float(last(unit, "TimeoutStopSec")) > SHUTDOWN_DEADLINE
    assert last(unit, "KillMode") == "mixed"  # SIGTERM to the supervisor only; it stops its shards in order
    assert last(unit, "Type") == "notify" and last(unit, "NotifyAccess") == "main"
    assert last(unit, "RemoveIPC") == "no"  # shared-memory queues outlive the processes
    assert last(unit, "ExecReload") == "/bin/kill -HUP $MAINPID"  # a rolling restart of the shards
    for name in UNIT_NAMES:
        assert last(service(name), "LimitNOFILE") == "65536"


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed")
def test_sysusers_creates_the_system_user(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    done = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(UNITS / "pynsqd.sysusers")],
                          capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    entry = next(line for line in (tmp_path / "etc/passwd").read_text().splitlines() if line.startswith("nsq:"))
    uid = int(entry.split(":")[2])
    assert 0 < uid < 1000 and entry.endswith(":/var/lib/pynsqd:/usr/sbin/nologin")
    for name in UNIT_NAMES:
        assert last(service(name), "User") == "nsq"


# --- sd_notify ------------------------------------------------------------------------------

def notify_socket(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return sock


def receive(sock: socket.socket, timeout: float) -> tuple[str, int]:
    """One datagram and the pid that sent it (SCM_CREDENTIALS, as systemd reads it)."""
    sock.settimeout(scaled(timeout))
    data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("3i")))
    pid = -1
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = array.array("i", payload[:12])[0]
    return data.decode(), pid


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_node_notifies_ready_and_stopping(tmp_path: Path, abstract: bool) -> None:
    name = f"@pynsqd-test-{os.getpid()}-{abstract}" if abstract else str(tmp_path / "notify.sock")
    sock = notify_socket("\0" + name[1:] if abstract else name)
    node = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                        f"--data-path={tmp_path / 'data'}", "--shards=2"],
                  env={"NOTIFY_SOCKET": name})
    (tmp_path / "data").mkdir()
    try:
        node.start()
        message, pid = receive(sock, 30)
        assert message.split("\n")[0] == "READY=1" and "STATUS=serving TCP on" in message
        assert pid == node.pid  # the supervisor itself: NotifyAccess=main accepts it
        # ready means serving: both shards answer, over TCP and HTTP
        assert httpx.post(f"{node.http_url}/pub", params={"topic": "t"}, content=b"x").text == "OK"
        with RawClient(node.tcp) as client:
            client.subscribe("t", "c", rdy=1)
            assert client.read_message().body == b"x"
        node.signal(signal.SIGHUP)  # systemctl reload: "reloading" until every shard is replaced
        message, pid = receive(sock, 30)
        assert message.startswith("RELOADING=1\nMONOTONIC_USEC=") and pid == node.pid
        message, pid = receive(sock, 60)
        assert message.split("\n")[0] == "READY=1" and pid == node.pid
        node.wait_for_log(r"reloaded: 2 of 2 shard\(s\) replaced")
        node.signal(signal.SIGTERM)
        message, pid = receive(sock, 30)
        assert message == "STOPPING=1" and pid == node.pid
        assert node.wait(30) == 0
    finally:
        node.stop()
        sock.close()
        remove_segments([node])


def test_node_without_notify_socket_sends_nothing(tmp_path: Path) -> None:
    """No NOTIFY_SOCKET, no datagram and no complaint (the plain command line)."""
    node = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                        f"--data-path={tmp_path}", "--shards=1"],
                  env={"NOTIFY_SOCKET": ""})
    try:
        node.start()
        assert httpx.get(f"{node.http_url}/ping").text == "OK"
    finally:
        node.stop()
        remove_segments([node])
    assert "notify" not in node.output


# --- the sandbox lets the node run ---------------------------------------------------------

def syscall_groups() -> dict[str, set[str]]:
    """systemd's system-call groups (``@name`` → members, nested groups expanded)."""
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"], capture_output=True, text=True,
                         check=True, timeout=scaled(60)).stdout
    raw: dict[str, list[str]] = {}
    current = ""
    for line in out.splitlines():
        if line.startswith("@"):
            current = line.strip()
            raw[current] = []
        elif current and line.strip() and not line.strip().startswith("#"):
            raw[current].append(line.strip())

    def expand(group: str, seen: frozenset[str] = frozenset()) -> set[str]:
        names: set[str] = set()
        for item in raw.get(group, []):
            names |= expand(item, seen | {group}) if item.startswith("@") and item not in seen else {item}
        return names
    return {group: expand(group) for group in raw}


def allowed_syscalls(unit: dict[str, list[str]], groups: dict[str, set[str]]) -> set[str]:
    """What the unit's SystemCallFilter= lines allow (an allow list, then ``~`` deny lists)."""
    allowed: set[str] = set()
    for line in unit["SystemCallFilter"]:
        deny = line.startswith("~")
        names: set[str] = set()
        for item in line.lstrip("~").split():
            names |= groups[item] if item.startswith("@") else {item}
        allowed = allowed - names if deny else allowed | names
    return allowed


@needs_systemd
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed (Debian package strace)")
def test_sandbox_allows_every_syscall_the_node_makes(tmp_path: Path) -> None:
    unit = service("nsqd-supervisor.service")
    allowed = allowed_syscalls(unit, syscall_groups())
    families = set(last(unit, "RestrictAddressFamilies").split())
    trace = tmp_path / "trace.txt"
    (tmp_path / "data").mkdir()
    node = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                        f"--data-path={tmp_path / 'data'}", "--shards=2", "--mem-queue-size=2"],
                  wrapper=["strace", "-f", "-qq", "-o", str(trace)])
    try:
        node.start(timeout=60)
        for topic in ("a", "b", "c", "d"):  # topics on both shards; cross-shard publishes; a spill to disk
            for _ in range(5):
                assert httpx.post(f"{node.http_url}/pub", params={"topic": topic}, content=b"m").text == "OK"
            with RawClient(node.tcp) as client:
                client.subscribe(topic, "c", rdy=10)
                for message in client.read_messages(5):
                    client.send(b"FIN " + message.id + b"\n")
        assert b"nsq_channel_depth" in httpx.get(f"{node.http_url}/metrics").content
        supervisor = int((Path(f"/proc/{node.pid}/task/{node.pid}/children")).read_text().split()[0])
        os.kill(supervisor, signal.SIGTERM)
        assert node.wait(60) == 0
    finally:
        node.stop()
        remove_segments([node])
    text = trace.read_text(errors="replace")
    used = set(re.findall(r"^\d+ +(?:<\.\.\. )?([a-z_0-9]+)(?:\(| resumed>)", text, re.M))
    assert {"sendmsg", "mmap", "eventfd2"} <= used, "the trace did not see the node work"
    assert used - allowed == set(), "system calls the unit's SystemCallFilter= would refuse"
    used_families = set(re.findall(r"\bsocket(?:pair)?\((AF_\w+)", text))
    assert used_families and used_families - families == set(), "socket families RestrictAddressFamilies= refuses"


# --- the units under a real systemd -----------------------------------------------------------

@pytest.fixture(scope="module")
def systemd_host(docker_engine: Engine, broker_image: str) -> Iterator[Callable[..., str]]:
    """A container booted by systemd (Debian's) holding the broker image's /opt/pynsqd, the units
    and the sample configs installed as deploy/systemd's comments say; yields ``sh(cmd)``."""
    ctx = docker_engine.workdir / "systemd"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"
        " systemd systemd-sysv procps && rm -rf /var/lib/apt/lists/*\n"
        f"COPY --from={broker_image} /opt/pynsqd /opt/pynsqd\n"
        'STOPSIGNAL SIGRTMIN+3\nCMD ["/sbin/init"]\n')
    image = f"{PREFIX}/systemd"
    docker_engine.run("build", "--network=host", "-t", image, str(ctx), timeout=600)
    name = f"{PREFIX}-systemd"
    docker_engine.run("run", "-d", "--name", name, "--network=none", "--cap-add=SYS_ADMIN",
                      "--security-opt=seccomp=unconfined", "--security-opt=apparmor=unconfined",
                      "--tmpfs=/run", "--tmpfs=/run/lock", "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
                      "-v", f"{UNITS}:/deploy/systemd:ro", "-v", f"{ROOT / 'deploy' / 'config'}:/deploy/config:ro",
                      image)

    def sh(command: str, check: bool = True) -> str:
        done = docker_engine.run("exec", name, "sh", "-c", command, check=False, timeout=180)
        assert not check or done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
        return done.stdout.strip()
    try:
        wait_for(lambda: sh("systemctl is-system-running", check=False) in ("running", "degraded"), 60,
                 interval=0.5, what="systemd booted")
        sh("cp /deploy/systemd/*.service /etc/systemd/system/"
           " && cp /deploy/systemd/pynsqd.sysusers /usr/lib/sysusers.d/pynsqd.conf && systemd-sysusers"
           " && mkdir -p /etc/pynsqd && cp /deploy/config/*.toml /etc/pynsqd/"
           " && sed -i 's/^nsqlookupd_tcp_addresses = .*/nsqlookupd_tcp_addresses = [\"127.0.0.1:4160\"]/'"
           " /etc/pynsqd/nsqd.toml && systemctl daemon-reload")
        yield sh
    finally:
        journal = docker_engine.run("exec", name, "journalctl", "--no-pager", "-n", "200", check=False).stdout
        (docker_engine.workdir / "systemd-journal.log").write_text(journal)
        docker_engine.run("rm", "-f", name, check=False)


PY = "/opt/pynsqd/bin/python3 -c"


def channel_depth(sh: Callable[..., str]) -> int:
    return int(sh(f"""{PY} 'import json, urllib.request; d = json.load(urllib.request.urlopen(
"http://127.0.0.1:4151/stats?format=json&topic=t")); print(d["topics"][0]["channels"][0]["depth"])'"""))


@pytest.mark.containers
@pytest.mark.timeout(900)
def test_units_run_under_systemd(systemd_host: Callable[..., str]) -> None:
    """The units start, serve, restart a killed node (its queues intact in /dev/shm under the
    sandbox) and stop it cleanly, under systemd itself."""
    sh = systemd_host
    sh("systemctl start nsqlookupd nsqd-supervisor nsqadmin")  # returns once READY=1 came (Type=notify)
    assert sh("systemctl is-active nsqlookupd nsqd-supervisor nsqadmin").split() == ["active"] * 3
    assert "serving TCP on 0.0.0.0:4150" in sh("systemctl show -p StatusText nsqd-supervisor")
    assert sh("stat -c %U /proc/$(systemctl show -p MainPID --value nsqd-supervisor)") == "nsq"
    sh(f"""{PY} 'import urllib.request as u
u.urlopen(u.Request("http://127.0.0.1:4151/topic/create?topic=t", method="POST"))
u.urlopen(u.Request("http://127.0.0.1:4151/channel/create?topic=t&channel=c", method="POST"))
assert u.urlopen(u.Request("http://127.0.0.1:4151/mpub?topic=t", data=b"a\\nb\\nc\\nd\\ne")).read() == b"OK"'""")
    assert channel_depth(sh) == 5
    # the node registered with the lookupd, and nsqadmin sees it there
    wait_for(lambda: '"t"' in sh(f"""{PY} 'import urllib.request as u
print(u.urlopen("http://127.0.0.1:4161/topics").read().decode())'"""), 15, interval=0.5, what="topic in nsqlookupd")
    assert "broadcast_address" in sh(f"""{PY} 'import urllib.request as u
print(u.urlopen("http://127.0.0.1:4171/api/nodes").read().decode())'""")

    # kill -9 of the whole tree: systemd restarts it, and the queued messages are still there
    sh("systemctl kill -s SIGKILL nsqd-supervisor")
    wait_for(lambda: sh("systemctl show -p NRestarts --value nsqd-supervisor") == "1"
             and sh("systemctl is-active nsqd-supervisor", check=False) == "active", 60, interval=0.5,
             what="nsqd-supervisor restarted by systemd")
    assert channel_depth(sh) == 5

    # systemctl reload: every shard replaced by a new process, the supervisor and the queue stay
    main_pid = sh("systemctl show -p MainPID --value nsqd-supervisor")
    sh("systemctl reload nsqd-supervisor")
    wait_for(lambda: "reloaded:" in sh("journalctl -u nsqd-supervisor --no-pager -n 50"), 60, interval=0.5,
             what="the reload to finish")
    assert sh("systemctl show -p MainPID --value nsqd-supervisor") == main_pid
    assert sh("systemctl is-active nsqd-supervisor") == "active"
    assert channel_depth(sh) == 5

    # SIGUSR2 to the main process: the supervisor re-executes itself in place (same MAINPID),
    # sandboxed as it is, and reloads the shards
    sh("systemctl kill --kill-whom=main --signal=SIGUSR2 nsqd-supervisor")
    wait_for(lambda: sh("journalctl -u nsqd-supervisor --no-pager -n 80").count("reloaded:") >= 2, 120,
             interval=0.5, what="the upgrade and its reload")
    assert "upgraded: this supervisor" in sh("journalctl -u nsqd-supervisor --no-pager -n 80")
    assert sh("systemctl show -p MainPID --value nsqd-supervisor") == main_pid
    assert sh("systemctl is-active nsqd-supervisor") == "active"
    assert channel_depth(sh) == 5

    # a clean stop: SIGTERM to the supervisor, exit 0 well inside TimeoutStopSec; the queue is on disk
    sh("systemctl stop nsqd-supervisor")
    assert sh("systemctl show -p Result -p ExecMainStatus nsqd-supervisor").split() == ["Result=success",
                                                                                       "ExecMainStatus=0"]
    assert "exited cleanly" in sh("journalctl -u nsqd-supervisor --no-pager -n 5")
    assert sh("ls /var/lib/pynsqd/nsqd").count("diskqueue") >= 2
    sh("systemctl start nsqd-supervisor")
    assert channel_depth(sh) == 5
    sh("systemctl stop nsqd-supervisor nsqadmin nsqlookupd")
