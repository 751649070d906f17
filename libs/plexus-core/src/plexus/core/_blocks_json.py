"""The JSON codec of a content-block list, the payload of every message: msgspec reads and writes the JSON,
each block's own compiled pydantic validator checks it.

Reading: msgspec parses the array and each object goes to its registered class's validator — the same
per-block validation as `content_block_from_dict`, without the list adapter's JSON parser and Python
dispatch in between (≈ 1.4 instead of 3 µs for a text message). Anything unusual — not an array of objects
with a string ``type``, a block that fails, a number msgspec will not represent (``1e999``) — is read again
by the full pydantic adapter, whose answer and error are the authoritative ones.

Writing: blocks of the built-in plain classes (no bytes, no nested blocks, no serializer of their own) are
encoded from their field dicts by msgspec when they hold no float (msgspec writes ``1e22`` where pydantic
writes ``1e+22``, and equal blocks must give identical bytes whichever path they take); a list holding any
other block is dumped by pydantic.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from pydantic import TypeAdapter

from ._content import (
    _REGISTRY,
    BaseBlock,
    CodeBlock,
    ContentBlock,
    DataBlock,
    ErrorBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    UIResourceBlock,
    UnknownBlock,
)
from ._json import sort_keys_deep

__all__ = ["content_blocks_from_json", "content_blocks_to_json"]

# Built once: dispatch goes through the registry at validation time, so later registrations need no rebuild.
_BLOCK_LIST_ADAPTER: TypeAdapter[list[ContentBlock]] = TypeAdapter(list[ContentBlock])
_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()

#: Exact classes (not subclasses, which may serialize differently) whose field dict is their JSON.
_PLAIN: frozenset[type[BaseBlock]] = frozenset(
    {TextBlock, CodeBlock, DataBlock, ErrorBlock, ToolUseBlock, ThinkingBlock, UIResourceBlock}
)


def content_blocks_from_json(data: bytes | str) -> list[BaseBlock]:
    """Parse a JSON array of blocks; raises pydantic's ValidationError on malformed input."""
    try:
        items = _DECODER.decode(data)
    except Exception:  # not JSON, or JSON msgspec will not represent: the adapter decides and says why
        return _BLOCK_LIST_ADAPTER.validate_json(data)
    if type(items) is not list:
        return _BLOCK_LIST_ADAPTER.validate_json(data)
    blocks: list[BaseBlock] = []
    for item in items:
        name = item.get("type") if type(item) is dict else None
        if type(name) is not str:
            return _BLOCK_LIST_ADAPTER.validate_json(data)
        cls = _REGISTRY.get(name)
        if cls is None:
            blocks.append(UnknownBlock.from_dict(item))
            continue
        try:
            # `model_validate` without its keyword handling: the same compiled validator, called directly.
            blocks.append(cls.__pydantic_validator__.validate_python(item))
        except ValueError:  # ValidationError: raised again by the adapter, with the block's index
            return _BLOCK_LIST_ADAPTER.validate_json(data)
    return blocks


def content_blocks_to_json(blocks: Sequence[BaseBlock]) -> bytes:
    """Serialize blocks to a compact JSON array (bytes as base64, metadata keys sorted)."""
    fields: list[dict[str, object]] = []
    for block in blocks:
        if type(block) not in _PLAIN:
            return _BLOCK_LIST_ADAPTER.dump_json(list(blocks))
        values = block.__dict__
        for value in values.values():
            if not (type(value) is str or _float_free(value)):
                return _BLOCK_LIST_ADAPTER.dump_json(list(blocks))
        if values["metadata"]:
            values = {**values, "metadata": sort_keys_deep(values["metadata"])}
        fields.append(values)
    return _ENCODER.encode(fields)


def _float_free(value: object) -> bool:
    kind = type(value)
    if kind is str or kind is bool or kind is int or value is None:
        return True
    if kind is dict:
        return all(map(_float_free, value.values()))  # type: ignore[attr-defined]
    if kind is list:
        return all(map(_float_free, value))  # type: ignore[call-overload]
    return False  # a float, or a value pydantic serializes in its own way
