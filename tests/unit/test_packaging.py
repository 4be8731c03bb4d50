"""pyproject.toml declares what the packages import: every third-party module imported by
``pynsqd/`` or ``pyspark_nsq/`` comes from a distribution in the dependencies, or in the extra
that the importing subpackage needs (the Spark code: ``spark``)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pynsqd

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pynsqd", "pyspark_nsq")
# code that runs only with an extra installed: path prefix (from the root) -> the extra
EXTRA_FOR = {"pynsqd/spark/": "spark", "pyspark_nsq/": "spark"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    return {canonical(re.split(r"[^A-Za-z0-9._-]", req, maxsplit=1)[0]) for req in requirements}


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the files (relative to the root) that import it."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_every_imported_distribution_is_declared_where_it_is_used() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = requirement_names(project["dependencies"])
    extras = {name: requirement_names(reqs) for name, reqs in project["optional-dependencies"].items()}
    distributions = importlib.metadata.packages_distributions()
    imports = third_party_imports()
    assert {"uvloop", "cramjam", "pyspark"} <= set(imports)  # the scan sees the imports
    missing = []
    for module, files in sorted(imports.items()):
        dists = {canonical(d) for d in distributions.get(module, [])}
        assert dists, f"{module} (imported by {sorted(files)}) is not installed"
        for file in sorted(files):
            extra = next((e for prefix, e in EXTRA_FOR.items() if file.startswith(prefix)), None)
            allowed = core | (extras[extra] if extra else set())
            if not dists & allowed:
                where = f"the dependencies or the {extra!r} extra" if extra else "the dependencies"
                missing.append(f"{file} imports {module} ({'/'.join(sorted(dists))}): not in {where}")
    assert not missing, "\n".join(missing)


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pynsqd.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", pynsqd.__version__)


def test_the_license_is_declared_and_shipped() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


def test_dependencies_have_lower_bounds_only() -> None:
    """No upper bound, exact pin or exclusion: the newest release of every dependency is the
    one an install takes, and the one the tests run against."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *(r for reqs in project["optional-dependencies"].values() for r in reqs)]
    for requirement in requirements:
        spec = re.sub(r"^[A-Za-z0-9._-]+(\[[^]]*\])?", "", requirement.split(";")[0]).strip()
        assert re.fullmatch(r"(>=[0-9][0-9.]*)?", spec), f"{requirement!r}: only a lower bound (>=) is allowed"


def test_every_dependency_is_imported() -> None:
    """A distribution the package no longer imports is no longer a dependency (the tools'
    run-time needs, such as a build backend, are not dependencies)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    imported = {canonical(dist) for module in third_party_imports()
                for dist in importlib.metadata.packages_distributions().get(module, [])}
    unused = requirement_names(project["dependencies"]) - imported
    assert not unused, f"declared but imported by nothing in {PACKAGES}: {sorted(unused)}"
