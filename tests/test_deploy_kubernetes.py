"""deploy/kubernetes: ``kubectl kustomize`` renders the base and the overlay; every rendered
object is valid against the Kubernetes API schemas (``kubernetes-validate --strict``: no unknown
field) and the PodMonitor against the Prometheus Operator's CRD schema
(``@kubernetes-models/prometheus-operator``); the daemons accept the containers' arguments; and
what the manifests promise about nsqd holds (grace period, /dev/shm budget, probes, PDB)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pynsqd.admin.config import parse_args as admin_args
from pynsqd.lookupd.config import parse_args as lookupd_args
from pynsqd.node.config import parse_args as nsqd_args
from pynsqd.supervisor.arbiter import SHUTDOWN_DEADLINE
from testbed.harness import scaled

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
JS = ROOT / "tests" / "support" / "js"
MIB = 1 << 20
INBOUND_RING = 16 * MIB  # one per ordered pair of shards (RING_SIZE, pynsqd/node/rings.py)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")]


def render(path: Path) -> list[dict[str, Any]]:
    done = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_base_renders_the_cluster() -> None:
    objects = by_kind(render(KUBE / "base"))
    assert set(objects) == {
        ("Service", "nsqlookupd"), ("StatefulSet", "nsqlookupd"), ("PodDisruptionBudget", "nsqlookupd"),
        ("Service", "nsqd"), ("StatefulSet", "nsqd"), ("PodDisruptionBudget", "nsqd"),
        ("Service", "nsqadmin"), ("Deployment", "nsqadmin")}
    assert objects[("StatefulSet", "nsqlookupd")]["spec"]["replicas"] == 2
    for obj in objects.values():
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pynsqd"


@pytest.mark.parametrize("path", ["base", "overlays/prometheus-operator"])
def test_rendered_objects_are_valid_kubernetes(path: str) -> None:
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    docs = render(KUBE / path)
    custom = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
        except SchemaNotFoundError:
            custom.append(doc)
        except ValidationError as exc:
            where = f"{doc['kind']}/{doc['metadata']['name']}"
            raise AssertionError(f"{where}: {exc.message} at {list(exc.path)}") from None
    assert [d["kind"] for d in custom] == (["PodMonitor"] if path != "base" else [])
    if custom:
        validate_custom(custom)


def validate_custom(objects: list[dict[str, Any]]) -> None:
    if shutil.which("node") is None or not (JS / "node_modules" / "@kubernetes-models").is_dir():
        pytest.skip("node or tests/support/js/node_modules missing (scripts/setup installs them with npm)")
    done = subprocess.run(["node", "validate_crds.mjs"], input=json.dumps(objects), capture_output=True, text=True,
                          cwd=JS, timeout=scaled(60))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": valid") == len(objects)


def test_the_validators_catch_mistakes() -> None:
    """The same checks reject a wrong field name and a wrong type."""
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError

    nsqd = by_kind(render(KUBE / "base"))[("StatefulSet", "nsqd")]
    nsqd["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(nsqd, "1.30.0", strict=True)
    monitor = by_kind(render(KUBE / "overlays" / "prometheus-operator"))[("PodMonitor", "nsqd")]
    monitor["spec"]["podMetricsEndpoints"][0]["port"] = 4151
    if shutil.which("node") is None or not (JS / "node_modules" / "@kubernetes-models").is_dir():
        pytest.skip("node or tests/support/js/node_modules missing (scripts/setup installs them with npm)")
    done = subprocess.run(["node", "validate_crds.mjs"], input=json.dumps([monitor]), capture_output=True, text=True,
                          cwd=JS, timeout=scaled(60))
    assert done.returncode == 1 and "must be string" in done.stdout


def container_args(obj: dict[str, Any]) -> list[str]:
    """The container's arguments with ``$(VAR)`` expanded as the kubelet does (pod fields given
    plausible values)."""
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    values = {"POD_NAME": f"{obj['metadata']['name']}-0", "POD_NAMESPACE": "nsq"}
    for env in container.get("env", []):
        if "value" in env:
            values[env["name"]] = env["value"]
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg) for arg in container["args"]]


def test_daemons_accept_their_arguments() -> None:
    objects = by_kind(render(KUBE / "base"))
    nsqd, _ = nsqd_args(container_args(objects[("StatefulSet", "nsqd")]))
    assert nsqd.broadcast_address == "nsqd-0.nsqd.nsq.svc"
    assert nsqd.lookupd_tcp_address == [f"nsqlookupd-{i}.nsqlookupd.nsq.svc:4160" for i in (0, 1)]
    lookupd, _ = lookupd_args(container_args(objects[("StatefulSet", "nsqlookupd")]))
    assert lookupd.broadcast_address == "nsqlookupd-0.nsqlookupd.nsq.svc"
    admin, _ = admin_args(container_args(objects[("Deployment", "nsqadmin")]))
    assert admin.lookupd_http_addresses == [f"nsqlookupd-{i}.nsqlookupd.nsq.svc:4161" for i in (0, 1)]
    for key, command in ((("StatefulSet", "nsqd"), "nsqd-supervisor"), (("StatefulSet", "nsqlookupd"), "nsqlookupd"),
                         (("Deployment", "nsqadmin"), "nsqadmin")):
        (container,) = objects[key]["spec"]["template"]["spec"]["containers"]
        assert container["command"] == [command]
        assert command in (ROOT / "pyproject.toml").read_text()  # a console script the image installs


def quantity(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": MIB, "Gi": 1 << 30}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", text)
    assert m is not None, text
    return int(m.group(1)) * units.get(m.group(2) or "", 1)


def test_nsqd_statefulset_keeps_its_promises() -> None:
    sts = by_kind(render(KUBE / "base"))[("StatefulSet", "nsqd")]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    opts, _ = nsqd_args(container_args(sts))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert float(env["PYNSQD_SHUTDOWN_DEADLINE"]) == SHUTDOWN_DEADLINE
    assert pod["terminationGracePeriodSeconds"] > SHUTDOWN_DEADLINE
    # /dev/shm: memory-backed, large enough for the stated queue budget and the inbound rings,
    # and inside the memory limit it counts against
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    queues = int(sts["metadata"]["annotations"]["pynsqd.io/shm-queue-budget"])
    need = queues * opts.mem_queue_bytes + INBOUND_RING * opts.shards * (opts.shards - 1)
    assert need <= quantity(shm["sizeLimit"]) < quantity(container["resources"]["limits"]["memory"])
    # one shard per CPU of the limit (inside a container the CPU count is the host's)
    assert opts.shards == int(container["resources"]["limits"]["cpu"])
    # the data path is the pod's own volume
    assert mounts[opts.data_path] == "data"
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ping" and "livenessProbe" in container
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    pdb = by_kind(render(KUBE / "base"))[("PodDisruptionBudget", "nsqd")]
    assert pdb["spec"]["selector"] == sts["spec"]["selector"] and pdb["spec"]["maxUnavailable"] == 1


def test_podmonitor_scrapes_the_nsqd_pods() -> None:
    objects = by_kind(render(KUBE / "overlays" / "prometheus-operator"))
    monitor, sts = objects[("PodMonitor", "nsqd")], objects[("StatefulSet", "nsqd")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert endpoint["path"] == "/metrics" and endpoint["port"] in {p["name"] for p in container["ports"]}
