"""deploy/docker: the Dockerfile builds (broker and spark targets) and the compose file runs the
whole cluster — 2 nsqlookupd, 3 nsqd, nsqadmin, Prometheus with pynsqd's rules, a Spark
standalone master and worker, and nsq_spark_pipeline reading over the lookupds — on a real
Docker engine (``tests/support/containers.py``: how the engine and the images are had here). The compose
file is used as it is, with its image names and published ports set by its own variables.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from testbed.harness import scaled, wait_for
from tests.support.containers import BASE_IMAGE, PREFIX, Engine

MESSAGES = 300  # published over the three nodes, read by the Spark pipeline

pytestmark = [pytest.mark.slow, pytest.mark.containers, pytest.mark.timeout(1200)]  # image builds and a JVM cluster


@pytest.fixture(scope="module")
def cluster(docker_engine: Engine, broker_image: str, spark_image: str, prometheus_image: str) -> Iterator[Engine]:
    engine = docker_engine
    engine.env.update(PYNSQD_IMAGE=broker_image, PYNSQD_SPARK_IMAGE=spark_image, PROMETHEUS_IMAGE=prometheus_image,
                      NSQADMIN_PORT="127.0.0.1:0", PROMETHEUS_PORT="127.0.0.1:0", SPARK_UI_PORT="127.0.0.1:0")
    try:
        engine.compose("up", "-d", "--no-build", timeout=600)
        yield engine
    finally:
        logs = engine.compose("logs", "--no-color", "--tail=40", check=False, timeout=120).stdout
        (engine.workdir / "compose.log").write_text(logs)
        engine.compose("down", "-v", "-t", "60", check=False, timeout=600)


def test_broker_image_is_slim_and_runs_as_nsq(docker_engine: Engine, broker_image: str, spark_image: str) -> None:
    engine, image = docker_engine, broker_image
    info = json.loads(engine.run("image", "inspect", image).stdout)[0]
    assert info["Config"]["User"] == "nsq"
    assert info["Config"]["Entrypoint"][0] == "nsqd-supervisor"
    out = engine.run("run", "--rm", "--entrypoint", "id", image).stdout
    assert out.startswith("uid=10001(nsq)")
    assert "nsqd v1.3.0" in engine.run("run", "--rm", image, "--version").stdout
    # the broker image has neither Java nor PySpark; the spark target has both
    assert engine.run("run", "--rm", "--entrypoint", "sh", image, "-c", "command -v java", check=False).returncode
    out = engine.run("run", "--rm", spark_image, "sh", "-c", "java -version 2>&1; python3 -c 'import pyspark; "
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


def test_broker_runs_as_the_statefulset_runs_it(docker_engine: Engine, broker_image: str) -> None:
    """The nsqd pod of deploy/kubernetes, as far as Docker can play it: the container's command
    and arguments, uid 10001, a read-only root file system, no capabilities, no privilege
    escalation, /dev/shm of the volume's size, a volume at /data and /tmp as an emptyDir."""
    from tests.test_deploy_kubernetes import KUBE, by_kind, container_args, quantity, render

    sts = by_kind(render(KUBE / "base"))[("StatefulSet", "nsqd")]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")["emptyDir"]
    name = f"{PREFIX}-pod"
    env = [f"--env={e['name']}={e['value']}" for e in container["env"] if "value" in e]
    docker_engine.run("run", "-d", "--name", name, "--network=none", "--read-only", "--tmpfs=/tmp",
                      f"--shm-size={quantity(shm['sizeLimit'])}", "--cap-drop=ALL",
                      "--security-opt=no-new-privileges", f"--user={pod['securityContext']['runAsUser']}",
                      "-v", f"{name}-data:/data", *env, "--entrypoint", container["command"][0], broker_image,
                      *container_args(sts))
    try:
        def pings() -> bool:
            done = docker_engine.run("exec", name, "python3", "-c", "import urllib.request; print(urllib.request"
                                     ".urlopen('http://127.0.0.1:4151/ping', timeout=2).read().decode())", check=False)
            return done.stdout.strip() == "OK"
        wait_for(pings, 60, interval=0.5, what="the pod's nsqd answering /ping")
        out = docker_engine.run("exec", name, "python3", "-c", """
import json, urllib.request
for t in ("a", "b", "c"):  # queues in /dev/shm, spills to /data
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:4151/pub?topic={t}", data=b"x"))
stats = json.load(urllib.request.urlopen("http://127.0.0.1:4151/stats?format=json"))
print(sorted((t["topic_name"], t["depth"]) for t in stats["topics"]))
""").stdout
        assert out.strip() == "[('a', 1), ('b', 1), ('c', 1)]"
        started = time.monotonic()
        docker_engine.run("stop", f"--time={pod['terminationGracePeriodSeconds']}", name, timeout=120)
        assert time.monotonic() - started < pod["terminationGracePeriodSeconds"]
        assert docker_engine.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    finally:
        docker_engine.run("rm", "-f", "-v", name, check=False)
        docker_engine.run("volume", "rm", f"{name}-data", check=False)
