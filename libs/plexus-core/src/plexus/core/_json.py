"""Shared JSON helpers: the `JsonValue` alias and deterministic encoding."""

from __future__ import annotations

import json
from typing import TypeAlias

# pydantic's alias is recursive for mypy and validates recursively at runtime, so fields typed with it
# reject non-JSON values (bytes, sets, objects) at construction instead of failing later on the wire.
from pydantic import JsonValue

__all__ = ["JsonObject", "JsonValue", "dumps_sorted", "sort_keys_deep"]

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
