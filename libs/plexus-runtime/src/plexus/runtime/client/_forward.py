"""`forward`: a method of a class that is a method of an object its instances hold.

`Runtime` holds its runs and schedules clients and offers their methods as its own: one line per method,
typed as the held method is (its parameters, its return), with its docstring, and no state shared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

__all__ = ["Forward", "forward"]

P = ParamSpec("P")
R = TypeVar("R")


class Forward(Generic[P, R]):
    """A descriptor: ``instance.name`` is ``getattr(instance, attr).name`` (a bound method)."""

    def __init__(self, attr: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._attr = attr
        self._name = method.__name__
        self.__doc__ = method.__doc__
        self.__wrapped__ = method  # `inspect.signature` and `help` show the held method's

    def __call__(self, instance: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Called on the class (``Runtime.start_run(rt, ...)``), as a plain method can be."""
        method: Callable[P, R] = getattr(getattr(instance, self._attr), self._name)
        return method(*args, **kwargs)

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Forward[P, R]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, instance: object | None, owner: type[Any]) -> Forward[P, R] | Callable[P, R]:
        if instance is None:
            return self
        bound: Callable[P, R] = getattr(getattr(instance, self._attr), self._name)
        return bound


def forward(attr: str, method: Callable[Concatenate[Any, P], R]) -> Forward[P, R]:
    """``name = forward("_held", Held.name)`` in a class body: its instances' ``name`` is the method of
    the object they hold in ``_held``. Not for overloaded methods (their overloads would be lost)."""
    return Forward(attr, method)
