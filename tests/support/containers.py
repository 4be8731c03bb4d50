"""A Docker engine and pynsqd's images for the deploy tests (fixtures, session-wide).

The engine: the one ``DOCKER_HOST`` (or ``/var/run/docker.sock``) names, else a private
``dockerd`` started here as root (its own data root, socket and bridge-only networking: no
iptables rules) and stopped by pid at the end of the session. Nothing comes from a registry: the
images' Python base is built from Debian's packages (``debootstrap`` bookworm with python3, the
interpreter of ``python:3.11-slim-bookworm``; cached as a tarball under ``/var/cache/pynsqd-test``),
the wheels come from pip on the host (``PIP_FIND_LINKS``/``PIP_NO_INDEX``, as an air-gapped
build would), and the Prometheus image holds Debian's ``prometheus`` binary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.harness import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
COMPOSE = ROOT / "deploy" / "docker" / "compose.yaml"
BASE_CACHE = Path("/var/cache/pynsqd-test/debian-bookworm-python3.tar")
BASE_IMAGE = "pynsqd-test/python:3.11-bookworm"
PROJECT = f"pynsqdtest{os.getpid()}"
PREFIX = PROJECT  # image names: <PREFIX>/pynsqd …


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
        """``docker-compose`` on deploy/docker/compose.yaml, as project ``PROJECT``."""
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


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if shutil.which("docker") is None and not Path("/usr/bin/docker").exists():
        pytest.skip("no docker CLI (Debian package docker.io; scripts/setup installs it as root)")
    if shutil.which("docker-compose") is None:
        pytest.skip("no docker-compose (Debian package docker-compose; scripts/setup installs it as root)")
    workdir = tmp_path_factory.mktemp("docker")
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    if "DOCKER_HOST" in env and not _answers(env):
        pytest.skip(f"the Docker engine at DOCKER_HOST={env['DOCKER_HOST']} does not answer")
    if "DOCKER_HOST" in env or (Path("/var/run/docker.sock").exists() and _answers(env)):
        engine = Engine(env, None, workdir)
        yield engine
        listed = engine.run("images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout.split()
        mine = [name for name in listed if name.startswith(f"{PREFIX}/") or name.startswith(BASE_IMAGE)]
        if mine:
            engine.run("image", "rm", *mine, check=False)
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
        for parent in Path("/sys/fs/cgroup").glob("*/docker"):  # the engine's (now empty) cgroups
            for child in (parent / "buildkit", parent):
                try:
                    child.rmdir()
                except OSError:
                    pass


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
    """A build context as .dockerignore lets it through, plus a wheelhouse made by the host's pip
    (with the build requirements: the image has no C compiler, so it installs the pure kernels)."""
    ctx = engine.workdir / "context"
    files = subprocess.run(["git", "ls-files", "-z", "pyproject.toml", "setup.py", "README.md", "LICENSE", "pynsqd",
                            "pyspark_nsq", ".dockerignore"],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        target = ctx / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name.decode(), target)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(ctx / "wheels"),
                    f"{ROOT}[spark]", "setuptools", "wheel", "Cython"],
                   check=True, capture_output=True, timeout=scaled(600))
    return ctx


@pytest.fixture(scope="session")
def image_context(docker_engine: Engine) -> Path:
    """The Python base image imported into the engine, and a build context with a wheelhouse."""
    _base_image(docker_engine)
    return _context(docker_engine)


def _build(engine: Engine, ctx: Path, tag: str, *args: str) -> str:
    engine.run("build", "--network=host", "-f", str(DOCKERFILE), f"--build-arg=PYTHON_IMAGE={BASE_IMAGE}",
               "--build-arg=PIP_FIND_LINKS=/src/wheels", "--build-arg=PIP_NO_INDEX=1", *args, "-t", tag, str(ctx),
               timeout=900)
    return tag


@pytest.fixture(scope="session")
def broker_image(docker_engine: Engine, image_context: Path) -> str:
    """deploy/docker/Dockerfile's default target, built here."""
    return _build(docker_engine, image_context, f"{PREFIX}/pynsqd")


@pytest.fixture(scope="session")
def spark_image(docker_engine: Engine, image_context: Path) -> str:
    """deploy/docker/Dockerfile's ``spark`` target, built here."""
    return _build(docker_engine, image_context, f"{PREFIX}/pynsqd-spark", "--target=spark")


@pytest.fixture(scope="session")
def prometheus_image(docker_engine: Engine) -> str:
    """Debian's prometheus binary on the base image (the compose file's ``PROMETHEUS_IMAGE``)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus is not installed (the compose file's Prometheus runs its binary)")
    ctx = docker_engine.workdir / "prometheus"
    ctx.mkdir()
    shutil.copy(binary, ctx / "prometheus")
    (ctx / "Dockerfile").write_text(f'FROM {BASE_IMAGE}\nCOPY prometheus /bin/prometheus\n'
                                    'ENTRYPOINT ["/bin/prometheus"]\n')
    docker_engine.run("build", "-t", f"{PREFIX}/prometheus", str(ctx))
    return f"{PREFIX}/prometheus"
