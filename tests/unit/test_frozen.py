"""``node/frozen.py``: records that behave as frozen dataclasses, without generated code."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest

from pynsqd.node.frozen import Frozen, frozen
from pynsqd.node.messages import HTTPResponse, Quiesce, StatsRequest


@frozen
class Point(Frozen):
    kind: ClassVar[str] = "point"
    x: int
    y: int = 0
    label: str = ""


@frozen
class Point3(Point):
    z: int = 0


@dataclasses.dataclass(frozen=True)
class PointDC:
    x: int
    y: int = 0
    label: str = ""


def test_construction_matches_a_frozen_dataclass() -> None:
    good: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((1,), {}), ((1, 2), {}), ((1,), {"label": "a"}),
                                                         ((), {"x": 3, "y": 4})]
    for args, kwargs in good:
        ours, theirs = Point(*args, **kwargs), PointDC(*args, **kwargs)
        assert (ours.x, ours.y, ours.label) == (theirs.x, theirs.y, theirs.label)
        assert repr(ours) == repr(theirs).replace("PointDC", "Point")
    bad: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((), {}), ((1, 2, "a", 4), {}), ((1,), {"w": 1}),
                                                        ((1,), {"x": 2})]
    for args, kwargs in bad:
        with pytest.raises(TypeError):
            PointDC(*args, **kwargs)
        with pytest.raises(TypeError):
            Point(*args, **kwargs)


def test_fields_are_immutable_compared_and_hashed_by_value() -> None:
    p = Point(1, 2)
    with pytest.raises(AttributeError):
        p.x = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.y
    with pytest.raises(AttributeError):
        p.other = 1
    assert not hasattr(p, "__dict__")
    assert p == Point(1, 2) and p != Point(1, 3) and hash(p) == hash(Point(1, 2))
    assert Point3(1, 2) != Point(1, 2)  # another type is never equal
    assert {p, Point(1, 2)} == {p}
    assert Point.kind == "point" and Point._fields == ("x", "y", "label")


def test_a_subclass_adds_fields_after_its_bases_and_replace_copies() -> None:
    p = Point3(1, 2, "a", 3)
    assert Point3._fields == ("x", "y", "label", "z") and repr(p) == "Point3(x=1, y=2, label='a', z=3)"
    assert p.replace(z=9) == Point3(1, 2, "a", 9) and p.z == 3


def test_a_declaration_dataclasses_refuse_is_refused() -> None:
    with pytest.raises(TypeError, match="mutable default"):
        @frozen
        class Bad(Frozen):
            items: list[int] = []
    with pytest.raises(TypeError, match="without a default"):
        @frozen
        class Late(Point):
            w: int  # type: ignore[misc]


def test_control_messages_are_frozen_records() -> None:
    assert Quiesce(2.5) == Quiesce(wait=2.5) and Quiesce(2.5) != Quiesce(1.0)
    with pytest.raises(AttributeError):
        Quiesce(2.5).wait = 1.0  # type: ignore[misc]
    assert StatsRequest(skip=1).replace(include_mem=False) == StatsRequest(include_mem=False, skip=1)
    assert HTTPResponse.payload_field == "body" and Quiesce.payload_field is None
