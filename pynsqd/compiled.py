"""Which kernels run: a compiled module (``setup.py`` builds them where Cython and a C compiler
are at hand) or its pure-Python twin. ``PYNSQD_PURE=1`` in the environment forces the pure
ones everywhere (the test suite runs on both)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE = os.environ.get("PYNSQD_PURE", "") not in ("", "0")


def compiled_twin(name: str) -> ModuleType | None:
    """The compiled module ``name``; None when it is not built or ``PYNSQD_PURE`` is set."""
    if PURE:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built: the pure functions serve
        return None
