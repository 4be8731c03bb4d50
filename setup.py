"""The compiled kernels (``pynsqd/shm/_logscan.pyx``, ``pynsqd/wire/_mpubscan.pyx``,
``pynsqd/wire/_idrecords.pyx``, ``pynsqd/wire/_frameruns.pyx``), built
when Cython and a C compiler are at hand; without either the install goes on with the
pure-Python twins (``pynsqd.compiled`` picks whichever is there). Everything else is in
pyproject.toml."""

from __future__ import annotations

import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython: nothing to compile
    cythonize = None

KERNELS = ["pynsqd/shm/_logscan.pyx", "pynsqd/wire/_mpubscan.pyx", "pynsqd/wire/_idrecords.pyx",
           "pynsqd/wire/_frameruns.pyx"]


class OptionalBuildExt(build_ext):
    """``build_ext`` that warns and goes on when an extension cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler (PlatformError, CCompilerError, OSError ...)
            self._skip("the kernels", exc)

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:  # CCompilerError, DistutilsError, OSError
            self._skip(ext.name, exc)

    @staticmethod
    def _skip(what: str, exc: Exception) -> None:
        print(f"warning: {what} not compiled ({exc}); pynsqd uses its pure-Python kernels", file=sys.stderr)


extensions = []
if cythonize is not None:
    try:
        extensions = cythonize(KERNELS, compiler_directives={"language_level": "3"}, quiet=True)
    except Exception as exc:  # a Cython too old or broken: the pure kernels serve
        print(f"warning: the kernels not cythonized ({exc}); pynsqd uses its pure-Python kernels", file=sys.stderr)

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
