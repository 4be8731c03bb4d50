"""The packages form layers: wire ← shm ← node ← {shard, supervisor}, without cycles, read
from the source's own imports; the modules of each package import each other without a
cycle too; and the supervisor runs without the shard's stack."""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pynsqd

ROOT = Path(pynsqd.__file__).parent


def _unit(module: str) -> str | None:
    """``pynsqd.shard.worker`` → ``shard``; ``pynsqd.logs`` → ``logs``; others → None."""
    parts = module.split(".")
    if parts[0] != "pynsqd" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (at any depth), ``from pynsqd import x`` as ``pynsqd.x``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def package_graph() -> dict[str, set[str]]:
    """Top-level unit → the units it imports (itself left out)."""
    units = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    graph: dict[str, set[str]] = {u: set() for u in units}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.name == "__init__.py" and len(rel.parts) == 1:
            continue
        source = rel.parts[0].removesuffix(".py")
        for module in _imports(path):
            target = _unit(module)
            if target in units and target != source:
                graph[source].add(target)
    return graph


def test_top_level_packages_import_each_other_without_a_cycle() -> None:
    graph = package_graph()
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise AssertionError(f"import cycle between packages: {' -> '.join(exc.args[1])}") from None


def _packages() -> list[Path]:
    """``pynsqd`` and every package below it."""
    return sorted(init.parent for init in ROOT.rglob("__init__.py"))


def test_modules_of_a_package_import_each_other_without_a_cycle() -> None:
    """Type-only imports (``if TYPE_CHECKING:``) count: a module that needs another's type
    while that one imports it takes an interface (a ``Protocol``) instead."""
    cycles = []
    for package in _packages():
        name = ".".join(("pynsqd", *package.relative_to(ROOT).parts))
        members = {f"{name}.{p.stem}": p for p in package.glob("*.py") if p.stem != "__init__"}
        graph = {m: {i for i in _imports(p) if i in members and i != m} for m, p in members.items()}
        try:
            tuple(TopologicalSorter(graph).static_order())
        except CycleError as exc:
            cycles.append(" -> ".join(exc.args[1]))
    assert not cycles, f"import cycles inside packages: {cycles}"


def test_imports_are_absolute() -> None:
    """What the cycle checks read: a relative import would go unseen."""
    relative = [str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py")
                if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(path.read_text())))]
    assert not relative, f"relative imports in {relative}"


def test_the_node_contract_sits_between_storage_and_the_processes() -> None:
    graph = package_graph()
    ours = {"wire", "shm", "node", "shard", "supervisor"}
    assert not graph["wire"] & ours
    assert graph["shm"] & ours <= {"wire"}
    assert graph["node"] & ours <= {"wire", "shm"}
    assert "shard" not in graph["supervisor"] and "supervisor" not in graph["shard"]
    assert "node" in graph["shard"] and "node" in graph["supervisor"]


def test_importing_the_supervisor_loads_nothing_of_the_shard() -> None:
    """In a fresh interpreter: the supervisor's command and every module of its package."""
    modules = sorted(f"pynsqd.supervisor.{p.stem}" for p in (ROOT / "supervisor").glob("*.py")
                     if p.stem != "__main__")
    code = ("import importlib, sys\n"
            f"for name in {modules!r}: importlib.import_module(name)\n"
            "print(' '.join(sorted(m for m in sys.modules if m == 'pynsqd.shard' or m.startswith('pynsqd.shard.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "", f"the supervisor loaded {out.stdout.strip()}"


def test_the_benchmarks_and_the_testbed_import_nothing_of_the_tests() -> None:
    """``bench/`` may drive what ``tests/`` drives only through ``testbed/`` (which imports
    neither); the tests may import bench code they exercise."""
    repo = Path(__file__).resolve().parents[2]
    offenders = []
    for top, banned in (("bench", {"tests"}), ("testbed", {"tests", "bench"})):
        for path in sorted((repo / top).rglob("*.py")):
            bad = sorted(m for m in _imports(path) if m.split(".")[0] in banned)
            if bad:
                offenders.append(f"{path.relative_to(repo)}: {bad}")
    assert not offenders, f"imports across the boundary: {offenders}"
