"""`ItemMemo`: a per-item result computed once for each transcript item while the item lives.

A run's transcript grows by a few items per model turn, and every turn sends all of it: converting every item
again made each turn's cost grow with the conversation (its model-facing copy, its provider message, its
JSON for the agent's state). The loop keeps its items as objects across turns and messages, so a result
keyed by the item's identity is computed once. Items are values (frozen models that nothing changes in
place), so a result stays true for as long as its item lives; the entry goes when the item does.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from plexus.core import Item

from ._fold import PrefixFold

__all__ = ["ItemMemo", "encode_json", "item_json", "transcript_bytes", "transcript_json"]

T = TypeVar("T")


class ItemMemo(Generic[T]):
    """``memo(item)`` is ``convert(item)``, computed on the first call for that item object only.

    Entries are keyed by identity and hold the item weakly: an item's entry is dropped when the item is
    collected, so an id the interpreter reuses never finds another item's result. A result is shared by every
    caller: treat it as read-only.
    """

    def __init__(self, convert: Callable[[Item], T]) -> None:
        self._convert = convert
        self._entries: dict[int, tuple[weakref.ref[Item], T]] = {}

    def __call__(self, item: Item) -> T:
        key = id(item)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is item:
            return entry[1]
        value = self._convert(item)
        self._entries[key] = (weakref.ref(item, self._forget(key)), value)
        return value

    def _forget(self, key: int) -> Callable[[weakref.ref[Item]], None]:
        entries = self._entries

        def forget(ref: weakref.ref[Item]) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:  # not a later item that reuses the id
                del entries[key]

        return forget

    def __len__(self) -> int:
        return len(self._entries)


#: Each item's JSON (``model_dump(mode="json")``), made once while the item lives: the agent's state holds
#: every item of the conversation, written again after every message; its size is checked before model calls.
item_json: ItemMemo[dict[str, Any]] = ItemMemo(lambda item: item.model_dump(mode="json"))

encode_json = msgspec.json.Encoder().encode


class _TranscriptJson:
    """The items' JSON objects so far and the sum of their encoded sizes."""

    __slots__ = ("objects", "size")

    def __init__(self) -> None:
        self.objects: list[dict[str, Any]] = []
        self.size = 0


def _add_json(transcript: _TranscriptJson, item: Item) -> None:
    obj = item_json(item)
    transcript.objects.append(obj)
    transcript.size += len(encode_json(obj))


#: A conversation's JSON so far: a model call checks its size, a message's end stores it (no pass over all).
_TRANSCRIPT_JSON = PrefixFold(_TranscriptJson, _add_json)


def transcript_json(items: Sequence[Item]) -> list[dict[str, Any]]:
    """The items' JSON objects (each shared with `item_json`: read-only), as the agent's state holds them."""
    return list(_TRANSCRIPT_JSON(items).objects)


def transcript_bytes(items: Sequence[Item]) -> int:
    """The size of ``items`` as JSON in the agent's state (a list of the items' JSON objects, compact)."""
    transcript = _TRANSCRIPT_JSON(items)
    count = len(transcript.objects)
    return transcript.size + count + 1 if count else 2  # the brackets and the commas between the items
