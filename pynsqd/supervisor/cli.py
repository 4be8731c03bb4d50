"""The entry points: ``nsqd-supervisor`` / ``nsqd`` and ``nsqd-reclaim-shm`` (``command.py``).

``nsqd`` forks the zygote (``node/zygote.py``) before it imports its own modules or reads its
flags: the zygote imports the shards' code on the other core meanwhile, which is most of a
node's start-up. So this module imports nothing heavy, and ``command.py`` is imported after
the fork. An upgrade's new image, which inherits running shards (``INHERITED_ENV``), starts
none; a run that ends without using it (``--version``, a bad flag) kills it.

The collector is off until the imports are done: what an import makes lives as long as the
process, and the collector would walk it again and again as it is made. Each process freezes
what it imported before turning it back on (``gc.freeze``), the zygote before it forks, so a
shard's collections never touch, and so never copy, the pages it shares with the zygote.
"""

from __future__ import annotations

import gc
import os
import resource

from pynsqd.node.zygote import Zygote
from pynsqd.supervisor import INHERITED_ENV


def raise_descriptor_limit() -> None:
    """The soft limit on open descriptors up to the hard one, as every Go program since Go
    1.19 does at start (so NSQ's nsqd does): a node under the common 1024 soft limit would
    refuse connections long before the one it replaces. Shards inherit it. A hard limit the
    kernel will not grant as a soft one (``RLIM_INFINITY`` past ``nr_open``) leaves it as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass


def main() -> None:
    gc.disable()  # until the imports are done: see the module doc
    raise_descriptor_limit()  # before the fork: the zygote's shards inherit it too
    # a shard the zygote forks never returns from here (``zygote.py``)
    zygote = None if INHERITED_ENV in os.environ else Zygote.start()
    try:
        from pynsqd.supervisor.command import nsqd  # after the fork: see the module doc
        nsqd(zygote)
    finally:
        if zygote is not None:
            zygote.close()


def reclaim_main() -> None:
    from pynsqd.supervisor.command import reclaim_main as run  # not at the top: see ``main``
    run()


if __name__ == "__main__":
    main()
