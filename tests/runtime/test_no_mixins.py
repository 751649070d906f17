"""No class of plexus.runtime declares attributes another class owns (issue 42: composition, not mixins).

A mixin (the worker's upkeep, the client's runs and schedules halves were) declares in its body the
attributes it borrows and never assigns them: the class it is mixed into does. Such a class is found here
as a class-body annotation without a value that neither the class nor one of its bases ever assigns.
Value classes (dataclasses, structs, models, protocols, enums, typed dicts, named tuples, exceptions)
declare fields that way by design, and are left out."""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import pkgutil
import textwrap
import typing
from collections.abc import Iterator
from types import ModuleType

import msgspec
import pydantic

import plexus.runtime

#: Public extension points whose declared attribute is set by the runtime, on purpose, from outside:
#: a user's agent is built by the user's factory, which never sees its id (`AgentType.create` sets it).
ALLOWED = {"plexus.runtime._agent.Agent": {"id"}}


def _modules() -> Iterator[ModuleType]:
    yield plexus.runtime
    for info in pkgutil.walk_packages(plexus.runtime.__path__, "plexus.runtime."):
        yield importlib.import_module(info.name)


def _is_value_class(cls: type) -> bool:
    return (
        dataclasses.is_dataclass(cls)
        or bool(getattr(cls, "_is_protocol", False))
        or issubclass(cls, (msgspec.Struct, pydantic.BaseModel, enum.Enum, BaseException))
        or typing.is_typeddict(cls)
        or (issubclass(cls, tuple) and hasattr(cls, "_fields"))
    )


def _class_node(cls: type) -> ast.ClassDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef)
    return node


def _assigned(cls: type) -> set[str]:
    """The attributes the methods of `cls` and of its bases assign (``self.x = ...``, ``setattr``)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # builtins and other classes without source assign nothing here
            continue
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if (
                        isinstance(part, ast.Attribute)
                        and isinstance(part.value, ast.Name)
                        and part.value.id in ("self", "cls")
                    ):
                        names.add(part.attr)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("__setattr__", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                names.add(node.args[1].value)
    return names


def _borrowed_by(cls: type) -> list[str]:
    """The attributes `cls` declares in its body that neither it nor its bases assign."""
    if _is_value_class(cls):
        return []
    declared = [
        node.target.id
        for node in _class_node(cls).body
        if isinstance(node, ast.AnnAssign) and node.value is None and isinstance(node.target, ast.Name)
    ]
    allowed = ALLOWED.get(f"{cls.__module__}.{cls.__qualname__}", set())
    assigned = _assigned(cls)
    return [name for name in declared if name not in assigned and name not in allowed]


class _Mixin:
    """Shaped like the old `Upkeep`: declares what the class it is mixed into assigns."""

    connection: object

    def use(self) -> object:
        return self.connection


class _Held:
    """Shaped like the new `Upkeep`: built with what it uses."""

    connection: object

    def __init__(self, connection: object) -> None:
        self.connection = connection


def test_no_class_declares_attributes_another_class_owns() -> None:
    borrowed: dict[str, list[str]] = {}
    seen: set[type] = set()
    for module in _modules():
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and cls not in seen:
                seen.add(cls)
                if missing := _borrowed_by(cls):
                    borrowed[f"{cls.__module__}.{cls.__qualname__}"] = missing
    assert seen, "no class of plexus.runtime was found: the walk is broken"
    assert borrowed == {}


def test_the_check_tells_a_mixin_from_a_held_object() -> None:
    assert _borrowed_by(_Mixin) == ["connection"]
    assert _borrowed_by(_Held) == []
