"""deploy/docker: the Dockerfile builds (broker and spark targets) and the compose file runs the
whole cluster — 2 nsqlookupd, 3 nsqd, nsqadmin, Prometheus with pynsqd's rules, a Spark
standalone master and worker, and nsq_spark_pipeline reading over the lookupds — on a real
Docker engine.

The engine: the one ``DOCKER_HOST`` (or ``/var/run/docker.sock``) names, else a private
``dockerd`` this module starts as root (its own data root, socket and bridge-only networking: no
iptables rules) and stops by pid. Nothing comes from a registry: the images' Python base is
built from Debian's packages (``debootstrap`` bookworm with python3, the interpreter of
``python:3.11-slim-bookworm``; cached as a tarball under ``/var/cache/pynsqd-test``), the
wheels come from pip on the host (``PIP_FIND_LINKS``/``PIP_NO_INDEX``, as an air-gapped build
would), and the Prometheus image holds Debian's ``prometheus`` binary
(``PROMETHEUS_IMAGE``). The compose file is used as it is, with its image names and published
ports set by its own variables.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import scaled, wait_for

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
COMPOSE = ROOT / "deploy" / "docker" / "compose.yaml"
BASE_CACHE = Path("/var/cache/pynsqd-test/debian-bookworm-python3.tar")
BASE_IMAGE = "pynsqd-test/python:3.11-bookworm"
PROJECT = f"pynsqdtest{os.getpid()}"
MESSAGES = 300  # published over the three nodes, read by the Spark pipeline

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1200)]  # image builds and a JVM cluster


def _docker_cli() -> list[str]:
    # Debian's docker.io CLI matches its engine and builds with the engine's BuildKit
    return ["/usr/bin/docker"] if Path("/usr/bin/docker").exists() else ["docker"]


class Engine:
    """A Docker engine to talk to: ``env`` for the CLI and docker-compose."""

    def __init__(self, env: dict[str, str], proc: subprocess.Popen[bytes] | None, workdir: Path) -> None:
        self.env = env
        self.proc = proc
        self.workdir = workdir

    def run(self, *args: str, timeout: float = 300, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*_docker_cli(), *args], env=self.env, capture_output=True, text=True,
                              timeout=scaled(timeout), **kw)
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args[:3])}… failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["docker-compose", "-p", PROJECT, "-f", str(COMPOSE), *args], env=self.env,
                              capture_output=True, text=True, timeout=scaled(timeout), cwd=ROOT)
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed:\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done


def _answers(env: dict[str, str]) -> bool:
    done = subprocess.run([*_docker_cli(), "version", "--format", "{{.Server.Version}}"], env=env,
                          capture_output=True, text=True, timeout=30)
    return done.returncode == 0


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if shutil.which("docker") is None and not Path("/usr/bin/docker").exists():
        pytest.skip("no docker CLI (Debian package docker.io; scripts/setup installs it as root)")
    if shutil.which("docker-compose") is None:
        pytest.skip("no docker-compose (Debian package docker-compose; scripts/setup installs it as root)")
    workdir = tmp_path_factory.mktemp("docker")
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    if "DOCKER_HOST" in env or Path("/var/run/docker.sock").exists():
        if not _answers(env):
            pytest.skip(f"the Docker engine at {env.get('DOCKER_HOST', '/var/run/docker.sock')} does not answer")
        yield Engine(env, None, workdir)
        return
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("no Docker engine, and dockerd cannot be started here (needs root and docker.io)")
    sock = workdir / "docker.sock"
    env["DOCKER_HOST"] = f"unix://{sock}"
    log = open(workdir / "dockerd.log", "wb")
    proc = subprocess.Popen(["dockerd", f"--data-root={workdir / 'root'}", f"--exec-root={workdir / 'exec'}",
                             f"--host=unix://{sock}", f"--pidfile={workdir / 'dockerd.pid'}",
                             "--iptables=false", "--ip-masq=false", "--bridge=none"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or (sock.exists() and _answers(env)), 60, interval=0.5,
                 what="dockerd")
        if proc.poll() is not None:
            pytest.skip(f"dockerd could not start here: {(workdir / 'dockerd.log').read_text()[-1500:]}")
        yield Engine(env, proc, workdir)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(scaled(60))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        subprocess.run(["umount", str(workdir / "exec" / "netns" / "default")], capture_output=True)
        shutil.rmtree(workdir / "root", ignore_errors=True)


def _base_image(engine: Engine) -> None:
    """The Python base: Debian bookworm (minbase) with python3 3.11 and venv, imported from a
    debootstrap tarball made once per machine."""
    if not BASE_CACHE.exists():
        if shutil.which("debootstrap") is None or os.geteuid() != 0:
            pytest.skip("no registry to pull python:3.11-slim from, and no debootstrap (as root) to build it")
        rootfs = engine.workdir / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                        "bookworm", str(rootfs), "http://deb.debian.org/debian"],
                       check=True, capture_output=True, timeout=scaled(600))
        subprocess.run(["rm", "-rf", str(rootfs / "var/cache/apt/archives"), str(rootfs / "var/lib/apt/lists")])
        BASE_CACHE.parent.mkdir(parents=True, exist_ok=True)
        partial = BASE_CACHE.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=scaled(300))
        partial.rename(BASE_CACHE)
        shutil.rmtree(rootfs, ignore_errors=True)
    with open(BASE_CACHE, "rb") as tarball:
        engine.run("import", "--change", "ENV LANG=C.UTF-8", "-", BASE_IMAGE, stdin=tarball)


def _context(engine: Engine) -> Path:
    """A build context as .dockerignore lets it through, plus a wheelhouse made by the host's pip."""
    ctx = engine.workdir / "context"
    files = subprocess.run(["git", "ls-files", "-z", "pyproject.toml", "README.md", "pynsqd", "pyspark_nsq",
                            ".dockerignore"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        target = ctx / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name.decode(), target)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(ctx / "wheels"),
                    f"{ROOT}[spark]", "setuptools", "wheel"], check=True, capture_output=True, timeout=scaled(600))
    return ctx


@pytest.fixture(scope="module")
def images(engine: Engine) -> dict[str, str]:
    _base_image(engine)
    ctx = _context(engine)
    built = {"PYNSQD_IMAGE": f"{PROJECT}/pynsqd", "PYNSQD_SPARK_IMAGE": f"{PROJECT}/pynsqd-spark",
             "PROMETHEUS_IMAGE": f"{PROJECT}/prometheus"}
    common = ["build", "--network=host", "-f", str(DOCKERFILE), f"--build-arg=PYTHON_IMAGE={BASE_IMAGE}",
              "--build-arg=PIP_FIND_LINKS=/src/wheels", "--build-arg=PIP_NO_INDEX=1"]
    engine.run(*common, "-t", built["PYNSQD_IMAGE"], str(ctx), timeout=600)
    engine.run(*common, "--target=spark", "-t", built["PYNSQD_SPARK_IMAGE"], str(ctx), timeout=900)
    prom = engine.workdir / "prometheus"
    prom.mkdir()
    shutil.copy(shutil.which("prometheus") or "/usr/bin/prometheus", prom / "prometheus")
    (prom / "Dockerfile").write_text(f'FROM {BASE_IMAGE}\nCOPY prometheus /bin/prometheus\n'
                                     'ENTRYPOINT ["/bin/prometheus"]\n')
    engine.run("build", "-t", built["PROMETHEUS_IMAGE"], str(prom))
    return built


@pytest.fixture(scope="module")
def cluster(engine: Engine, images: dict[str, str]) -> Iterator[Engine]:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed (the compose file's Prometheus runs its binary)")
    engine.env.update(images, NSQADMIN_PORT="127.0.0.1:0", PROMETHEUS_PORT="127.0.0.1:0",
                      SPARK_UI_PORT="127.0.0.1:0")
    try:
        engine.compose("up", "-d", "--no-build", timeout=600)
        yield engine
    finally:
        logs = engine.compose("logs", "--no-color", "--tail=40", check=False, timeout=120).stdout
        (engine.workdir / "compose.log").write_text(logs)
        engine.compose("down", "-v", "-t", "60", check=False, timeout=600)


def test_broker_image_is_slim_and_runs_as_nsq(engine: Engine, images: dict[str, str]) -> None:
    image = images["PYNSQD_IMAGE"]
    info = json.loads(engine.run("image", "inspect", image).stdout)[0]
    assert info["Config"]["User"] == "nsq"
    assert info["Config"]["Entrypoint"][0] == "nsqd-supervisor"
    out = engine.run("run", "--rm", "--entrypoint", "id", image).stdout
    assert out.startswith("uid=10001(nsq)")
    assert "nsqd v1.3.0" in engine.run("run", "--rm", image, "--version").stdout
    # the broker image has neither Java nor PySpark; the spark target has both
    assert engine.run("run", "--rm", "--entrypoint", "sh", image, "-c", "command -v java", check=False).returncode
    spark = images["PYNSQD_SPARK_IMAGE"]
    out = engine.run("run", "--rm", spark, "sh", "-c", "java -version 2>&1; python3 -c 'import pyspark; "
                     "print(pyspark.__version__)'").stdout
    assert "openjdk version \"17" in out
    base = json.loads(engine.run("image", "inspect", BASE_IMAGE).stdout)[0]["Size"]
    assert info["Size"] - base < 150 * 2**20, "the broker adds more than 150 MiB to its base"


def _exec_python(engine: Engine, service: str, code: str, timeout: float = 120) -> str:
    return engine.compose("exec", "-T", service, "python3", "-c", code, timeout=timeout).stdout


def _published(engine: Engine, service: str, port: int) -> str:
    return engine.compose("port", service, str(port)).stdout.strip()


def test_compose_runs_the_whole_cluster(cluster: Engine) -> None:
    def all_healthy() -> bool:
        states = cluster.compose("ps").stdout
        return states.count("(healthy)") == 5 and "Exit" not in states and "Restarting" not in states
    wait_for(all_healthy, 180, interval=2, what="2 nsqlookupd and 3 nsqd healthy")

    # nsqadmin, from the host, sees the three nodes through both lookupds
    admin = f"http://{_published(cluster, 'nsqadmin', 4171)}"

    def nodes() -> list[str]:
        reply = httpx.get(f"{admin}/api/nodes", timeout=10).json()
        return sorted(n["broadcast_address"] for n in reply.get("nodes", []))
    assert wait_for(lambda: nodes() == ["nsqd-1", "nsqd-2", "nsqd-3"], 60, interval=1, what="3 nodes in nsqadmin")
    for lookupd in ("nsqlookupd-1", "nsqlookupd-2"):
        out = _exec_python(cluster, lookupd, "import urllib.request; "
                           "print(urllib.request.urlopen('http://127.0.0.1:4161/nodes').read().decode())")
        assert sorted(p["broadcast_address"] for p in json.loads(out)["producers"]) == ["nsqd-1", "nsqd-2", "nsqd-3"]

    # messages published to every node reach the Spark pipeline, which finds the nodes through
    # the lookupds and writes them to Parquet on the shared volume
    per_node = MESSAGES // 3
    _exec_python(cluster, "nsqd-1", f"""
import urllib.request
for n in (1, 2, 3):
    body = "\\n".join(f"msg-{{n}}-{{i}}" for i in range({per_node})).encode()
    reply = urllib.request.urlopen(urllib.request.Request(f"http://nsqd-{{n}}:4151/mpub?topic=events", data=body))
    assert reply.read() == b"OK"
""")
    count_rows = """
import pyarrow.dataset as ds, pyarrow.compute as pc
try:
    table = ds.dataset("/spark/events", format="parquet", partitioning="hive").to_table(columns=["id"])
    print(len(pc.unique(table["id"])))
except (FileNotFoundError, ValueError):
    print(0)
"""
    wait_for(lambda: int(_exec_python(cluster, "nsq-spark-pipeline", count_rows).strip() or 0) >= MESSAGES,
             240, interval=3, what=f"{MESSAGES} rows written by nsq_spark_pipeline")
    wait_for(lambda: "nsq_spark_pipeline: batch" in cluster.compose("logs", "--no-color", "nsq-spark-pipeline").stdout,
             60, interval=2, what="the pipeline's progress line")

    # Prometheus, with deploy/prometheus's config and rules, scrapes the three nodes
    prometheus = f"http://{_published(cluster, 'prometheus', 9090)}"

    def scraped() -> bool:
        reply = httpx.get(f"{prometheus}/api/v1/query", params={"query": 'sum(up{job="nsqd"})'}, timeout=10).json()
        result = reply.get("data", {}).get("result", [])
        return bool(result) and float(result[0]["value"][1]) == 3
    wait_for(scraped, 90, interval=2, what="Prometheus scraping 3 nodes")
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert rules and all(r["health"] in ("ok", "unknown") for g in rules for r in g["rules"])

    # a node stops cleanly inside its grace period (exit 0: drained, not killed) and comes back
    # with what it had queued: the channel's consumer is gone with the stop, its messages stay
    _exec_python(cluster, "nsqd-3", """
import urllib.request
node = "http://127.0.0.1:4151"
urllib.request.urlopen(urllib.request.Request(f"{node}/topic/create?topic=kept", method="POST"))
urllib.request.urlopen(urllib.request.Request(f"{node}/channel/create?topic=kept&channel=c", method="POST"))
urllib.request.urlopen(urllib.request.Request(f"{node}/mpub?topic=kept", data=b"a\\nb\\nc"))
""")
    started = time.monotonic()
    cluster.compose("stop", "-t", "45", "nsqd-3", timeout=120)
    assert time.monotonic() - started < scaled(45)
    container = cluster.compose("ps", "-q", "nsqd-3").stdout.strip()
    assert cluster.run("inspect", "--format", "{{.State.ExitCode}}", container).stdout.strip() == "0"
    cluster.compose("start", "nsqd-3")
    wait_for(lambda: "nsqd-3" in cluster.compose("ps").stdout and all_healthy(), 120, interval=2,
             what="nsqd-3 healthy again")
    out = _exec_python(cluster, "nsqd-3", "import urllib.request, json; d = json.load(urllib.request.urlopen("
                       "'http://127.0.0.1:4151/stats?format=json&topic=kept')); "
                       "print(d['topics'][0]['channels'][0]['depth'])")
    assert out.strip() == "3"
