"""Shared JSON helpers: the `JsonValue` alias and deterministic encoding."""

from __future__ import annotations

import json
import math
from typing import Annotated, TypeAlias

# pydantic's alias is recursive for mypy and validates recursively at runtime, so fields typed with it
# reject non-JSON values (bytes, sets, objects) at construction instead of failing later on the wire.
from pydantic import AfterValidator
from pydantic import JsonValue as _PydanticJsonValue

__all__ = ["JsonObject", "JsonValue", "dumps_sorted", "sort_keys_deep"]


def _finite(value: _PydanticJsonValue) -> _PydanticJsonValue:
    # JSON has no NaN/Infinity: pydantic would write them as null, silently changing the value.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"JSON numbers must be finite, got {value}")
    if isinstance(value, dict):
        for item in value.values():
            _finite(item)
    elif isinstance(value, list):
        for item in value:
            _finite(item)
    return value


JsonValue: TypeAlias = Annotated[_PydanticJsonValue, AfterValidator(_finite)]

JsonObject: TypeAlias = dict[str, JsonValue]


def sort_keys_deep(value: JsonValue) -> JsonValue:
    """Return `value` with every nested object's keys in sorted order (lists keep their order)."""
    if isinstance(value, dict):
        return {k: sort_keys_deep(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sort_keys_deep(v) for v in value]
    return value


def dumps_sorted(obj: JsonValue) -> str:
    """Deterministic JSON: sorted keys, compact separators, UTF-8 text kept as is.

    NaN/Infinity are rejected (ValueError) because they are not JSON and other parsers refuse them.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
