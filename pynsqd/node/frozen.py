"""Frozen records made without generated code: the control messages' classes.

``@dataclasses.dataclass(frozen=True)`` compiles six methods per class from source text
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``): about
0.7 ms a class, and every process of a node imports the thirty control messages of
``messages.py`` at start, where that was a fifth of the supervisor's own import time.
``frozen`` turns an annotated class into the same kind of value — positional and keyword
construction with defaults, immutable, compared and hashed by its fields, a readable
``repr`` — from methods written once here (``Frozen``), so making a class costs one
``type()`` call. Type checkers see it as a frozen dataclass (``dataclass_transform``).

Fields are the class's annotations that are not ``ClassVar``, bases first, as dataclasses
number them; a field with a default may not come before one without. A default must be
immutable (no ``list``, ``dict`` or ``set``: a dataclass needs ``default_factory`` for those,
which this does not offer). The instances have ``__slots__``.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, TypeVar, cast, dataclass_transform

T = TypeVar("T", bound="Frozen")
_MISSING = object()
_setattr = object.__setattr__


class Frozen:
    """The methods of every ``frozen`` class; its fields are named in ``_fields``."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _types: ClassVar[dict[str, str]] = {}  # each field's annotation, as written
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = self._fields
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes {len(fields)} arguments, {len(args)} given")
        for name, value in zip(fields, args):
            _setattr(self, name, value)
        for name in fields[len(args):]:
            value = kwargs.pop(name, _MISSING)
            if value is _MISSING:
                value = self._defaults.get(name, _MISSING)
                if value is _MISSING:
                    raise TypeError(f"{type(self).__name__}() missing argument {name!r}")
            _setattr(self, name, value)
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got unexpected arguments {sorted(kwargs)}")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frozen) or type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({inner})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")

    def replace(self: T, **changes: Any) -> T:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return type(self)(**{**{name: getattr(self, name) for name in self._fields}, **changes})


@dataclass_transform(frozen_default=True)
def frozen(cls: type[T]) -> type[T]:
    """``cls`` (a subclass of ``Frozen``) as a frozen record of its annotated fields."""
    types = {name: str(kind) for name, kind in inspect.get_annotations(cls).items()
             if not str(kind).startswith(("ClassVar", "typing.ClassVar"))}
    own = list(types)
    defaults = dict(cls._defaults)
    for name in own:
        if name in cls.__dict__:
            value = cls.__dict__[name]
            if isinstance(value, (list, dict, set)):
                raise TypeError(f"{cls.__name__}.{name}: a mutable default")
            defaults[name] = value
        elif defaults:
            raise TypeError(f"{cls.__name__}.{name}: a field without a default after one with")
    namespace = {k: v for k, v in cls.__dict__.items() if k not in own and k not in ("__dict__", "__weakref__")}
    namespace["__slots__"] = tuple(own)
    namespace["_fields"] = (*cls._fields, *own)
    namespace["_types"] = {**cls._types, **types}
    namespace["_defaults"] = defaults
    made = type(cls.__name__, cls.__bases__, namespace)
    made.__qualname__ = cls.__qualname__
    return cast(type[T], made)
