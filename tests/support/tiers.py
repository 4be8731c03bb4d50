"""The two tiers of the test suite, declared by each module (``scripts/test``).

A module in a ``unit`` folder starts no daemon: it is in the fast tier by where it stands.
Every other test module says its tier with ``pytestmark``: ``pytest.mark.fast`` (small
integration tests, seconds) or ``pytest.mark.slow`` (restarts, kills, clusters, foreign
clients: minutes). Collection stops with a usage error naming a module that says neither or
both, so a new daemon test cannot land in a tier by omission. A test marked ``spark``,
``containers`` or ``clients`` is slow wherever it stands.
"""

from __future__ import annotations

import pytest

TIERS = ("fast", "slow")
SLOW_MARKERS = ("spark", "containers", "clients")


def _declared(module: object) -> set[str]:
    marks = getattr(module, "pytestmark", [])
    if not isinstance(marks, list):
        marks = [marks]
    return {mark.name for mark in marks if isinstance(mark, pytest.MarkDecorator | pytest.Mark)} & set(TIERS)


def undeclared(items: list[pytest.Item]) -> list[str]:
    """The paths of the modules of ``items`` outside a ``unit`` folder that do not declare
    exactly one tier."""
    bad: dict[str, None] = {}
    for item in items:
        if "unit" in item.path.parent.parts[-1:]:
            continue
        module = getattr(item, "module", None)
        if module is not None and len(_declared(module)) != 1:
            bad[str(item.path)] = None
    return list(bad)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    bad = undeclared(items)
    if bad:
        raise pytest.UsageError("test modules must declare their tier, pytestmark = pytest.mark.fast "
                                "(seconds) or pytest.mark.slow (minutes), exactly one: " + ", ".join(bad))
    for item in items:
        if any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
