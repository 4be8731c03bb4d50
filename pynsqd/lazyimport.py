"""Modules whose code runs the first time one of their attributes is used.

A shard imports the whole of its code before it can serve, and a fresh node's first
``/ping`` waits for that (``node/zygote.py``). Some of it serves only requests that may never
come, or come later: the web framework behind the HTTP API's administrative routes, the
codecs of a compressed connection. ``lazy_module(name)`` is stdlib's ``LazyLoader`` recipe:
the module object exists at once, and its code runs on first use, in whichever request
needs it first. The module's parent packages are imported at once (for ``starlette``, its
version string), as ``import a.b`` would.

A module already imported is returned as it is. Type checkers see the real module: import it
under ``TYPE_CHECKING`` beside the call.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name``'s module, registered in ``sys.modules`` and on its parent package; its code
    runs at the first access to one of its attributes. Raises ``ModuleNotFoundError`` now
    if it is not installed."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module
