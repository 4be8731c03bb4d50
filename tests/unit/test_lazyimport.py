"""``lazy_module``: a module whose code runs at the first use of one of its attributes; and
the shard's code, which leaves the web framework and the snappy codec to their first use."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynsqd.lazyimport import lazy_module


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    """A package whose module ``mod`` counts, on the package, how often its code ran."""
    name = f"lazyprobe_{tmp_path.name.replace('-', '_')}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("runs = 0\n")
    (pkg / "mod.py").write_text(f"import {name}\n{name}.runs += 1\nVALUE = 42\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def test_the_code_runs_at_the_first_attribute_use_and_once(package: str) -> None:
    mod = lazy_module(f"{package}.mod")
    pkg = sys.modules[package]
    assert pkg.runs == 0
    assert mod.VALUE == 42
    assert pkg.runs == 1
    assert mod.VALUE == 42
    assert pkg.runs == 1


def test_it_is_the_module_an_import_finds_and_on_its_parent(package: str) -> None:
    mod = lazy_module(f"{package}.mod")
    assert sys.modules[package].mod is mod
    assert sys.modules[f"{package}.mod"] is mod
    assert lazy_module(f"{package}.mod") is mod  # registered: not made twice
    exec(f"from {package}.mod import VALUE as v; assert v == 42", {})
    assert sys.modules[package].runs == 1


def test_a_module_that_is_not_installed_fails_at_once(package: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        lazy_module(f"{package}.missing")
    with pytest.raises(ModuleNotFoundError):
        lazy_module("no_such_top_level_module_xyz")


def test_a_shard_imports_neither_the_web_framework_nor_the_snappy_codec() -> None:
    """What only routed HTTP requests (starlette, and anyio under it) or a snappy connection
    use is not run when a shard's code is imported: a fresh node serves its first ``/ping``
    and publishes sooner for it."""
    probe = ("import sys, pynsqd.shard.worker; "
             "print(' '.join(m for m in ('anyio', 'snappy.snappy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == []
