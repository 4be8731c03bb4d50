"""What a shard worker is started with: ``BootConfig``, from the supervisor's ``launch``.

A worker is a fresh interpreter (``worker_command``) whose descriptors — its end of the
control socketpair, its heartbeat page, one eventfd per shard — are inherited and named
here, with the node's resolved options, so it never re-reads flags or config files. The
config travels as JSON in the ``ENV`` environment variable. At a node's first boot a worker
is a fork of the zygote instead (``zygote.py``), which received the same JSON and the
descriptors over a socket (``with_descriptors``). A worker that cannot start
writes one line on stderr and exits with ``BOOT_ERROR``, which stops the node instead of
respawning it.

A worker runs the supervisor's code, whatever directory the node was started from. It is
not ``python -m pynsqd.shard.worker``: ``-m`` puts the working directory first on
``sys.path``, so a ``pynsqd/`` folder there (another checkout) would be imported by the
shards and not by the supervisor. The interpreter runs in safe-path mode (``-P``) and takes
the supervisor's ``sys.path`` as it is (``PATH_ENV``, JSON) before it imports anything of
ours, so every module, ours or a dependency, resolves as it did in the supervisor.

A *standby* worker replaces a running shard (``supervisor/reload.py``): it boots as far
as it can without the shard's queues, says ``Standby``, and takes the queues and
connections over from the ``Handover`` of the process it replaces.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import orjson

from pynsqd.node.config import NsqdOptions
from pynsqd.node.zygote import WORKER_MODULE
from pynsqd.shm.sizing import LogSizing

ENV = "PYNSQD_WORKER"  # the environment variable naming a spawned process as a worker
IMPORT_CHECK = "PYNSQD_IMPORT_CHECK"  # set: import everything, parse the command line, exit 0
PATH_ENV = "PYNSQD_SYS_PATH"  # the supervisor's sys.path, for the worker to import from
BOOT_ERROR = 3  # exit status: this worker cannot start; do not respawn (gunicorn's 3 too)
# what the new interpreter runs (stdlib only until sys.path is this process's)
_BOOTSTRAP = (f"import json, os, sys; sys.path[:] = json.loads(os.environ.pop({PATH_ENV!r})); "
              "from {module} import main; main()")


def same_code_command(module: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv of a Python process that runs ``module``'s ``main`` with ``args`` (its
    ``sys.argv[1:]``), and what its environment adds: it imports exactly what this process
    would import now (the module doc), whatever its working directory."""
    argv = [sys.executable, "-P", "-c", _BOOTSTRAP.format(module=module), *args]
    return argv, {PATH_ENV: json.dumps(sys.path)}


def worker_command() -> tuple[list[str], dict[str, str]]:
    """The argv of a worker (its one argument only names it in ``ps``) and what its
    environment adds (``same_code_command``)."""
    return same_code_command(WORKER_MODULE, [WORKER_MODULE])


@dataclasses.dataclass(frozen=True)
class BootConfig:
    index: int  # this shard
    shards: int
    parent: int  # the supervisor's pid: a worker whose parent is gone exits
    opts: NsqdOptions
    log_sizing: LogSizing  # planned once for the node
    start_time: int  # the node's, in seconds and nanoseconds
    start_ns: int
    tcp_port: int  # the node's listeners, for /info and lookupd
    http_port: int
    https_port: int
    http: bool  # the node serves HTTP / HTTPS (connections come as ``ServeHTTP``)
    https: bool
    control_fd: int  # inherited descriptors
    heartbeat_fd: int
    wake_fds: list[int]  # one eventfd per shard: wakes its inbound rings' owner
    standby: bool = False  # a replacement: wait for the running shard's ``Handover``

    @property
    def inherited(self) -> list[int]:
        return [self.control_fd, self.heartbeat_fd, *self.wake_fds]

    def with_descriptors(self, fds: list[int]) -> BootConfig:
        """This config in a process that received ``inherited`` as ``fds`` (``SCM_RIGHTS``
        numbers them anew)."""
        return dataclasses.replace(self, control_fd=fds[0], heartbeat_fd=fds[1], wake_fds=list(fds[2:]))

    def encode(self) -> str:
        return orjson.dumps(dataclasses.asdict(self)).decode()

    @classmethod
    def decode(cls, text: str) -> BootConfig:
        raw = orjson.loads(text)
        raw["opts"] = NsqdOptions(**raw["opts"])
        raw["log_sizing"] = LogSizing(**raw["log_sizing"])
        return cls(**raw)

    @classmethod
    def from_environment(cls) -> BootConfig:
        """This worker's config (removed from the environment, so children do not see it)."""
        return cls.decode(os.environ.pop(ENV))
