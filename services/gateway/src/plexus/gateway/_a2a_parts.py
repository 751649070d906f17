"""Plexus content blocks ↔ A2A parts, both ways (the table is in docs/interop.md).

A part is a oneof ``text | raw | url | data``. Text, data and media blocks map onto their own kind; every
other block (code, error, tool records, thinking...) goes out as a data part holding the block's JSON, its
type named in the part's metadata (``plexus_type``) so a Plexus caller can rebuild it. Incoming parts with
none of the four (an unknown kind from a newer peer, or a malformed one) are refused, never dropped.
"""

from __future__ import annotations

from typing import Any

from a2a.types import InvalidParamsError, Part
from google.protobuf.json_format import MessageToDict, ParseDict  # type: ignore[import-untyped]
from google.protobuf.struct_pb2 import Value  # type: ignore[import-untyped]

from plexus.core import (
    AudioBlock,
    BaseBlock,
    DataBlock,
    DocumentBlock,
    ImageBlock,
    MediaBlock,
    TextBlock,
    VideoBlock,
    content_block_to_dict,
)

__all__ = ["PLEXUS_TYPE", "blocks_from_parts", "parts_from_blocks"]

#: The part metadata key naming the Plexus block a data part carries (absent for a plain DataBlock).
PLEXUS_TYPE = "plexus_type"

_MEDIA: tuple[tuple[str, type[MediaBlock]], ...] = (
    ("image/", ImageBlock),
    ("audio/", AudioBlock),
    ("video/", VideoBlock),
)


def _media_class(media_type: str) -> type[MediaBlock]:
    for prefix, cls in _MEDIA:
        if media_type.startswith(prefix):
            return cls
    return DocumentBlock


def blocks_from_parts(parts: Any) -> list[BaseBlock]:
    """An A2A message's parts as input blocks; `InvalidParamsError` (-32602) names the first bad part."""
    blocks: list[BaseBlock] = []
    for i, part in enumerate(parts):
        try:
            blocks.append(_block(part))
        except ValueError as exc:
            raise InvalidParamsError(f"message part {i}: {exc}") from None
    if not blocks:
        raise InvalidParamsError("the message has no parts")
    return blocks


def _block(part: Part) -> BaseBlock:
    kind = part.WhichOneof("content")
    if kind == "text":
        return TextBlock(text=part.text)
    if kind == "data":
        data = MessageToDict(part.data)
        if not isinstance(data, dict):
            raise ValueError("a data part is a JSON object here (Plexus DataBlock)")
        return DataBlock(data=data)
    if kind in ("raw", "url"):
        media_type = part.media_type or "application/octet-stream"
        fields: dict[str, Any] = {"mime_type": media_type}
        fields["data" if kind == "raw" else "url"] = part.raw if kind == "raw" else part.url
        cls = _media_class(media_type)
        if cls is DocumentBlock and part.filename:
            fields["filename"] = part.filename
        return cls.model_validate(fields)
    raise ValueError("unknown part: it has none of text, raw, url or data")


def parts_from_blocks(blocks: list[BaseBlock]) -> list[Part]:
    """Reply blocks as parts (media should be resolved inline or to a URL first: a storage handle is an
    internal id and goes out as the block's JSON)."""
    return [_part(b) for b in blocks]


def _part(block: BaseBlock) -> Part:
    if isinstance(block, TextBlock):
        return Part(text=block.text)
    if isinstance(block, DataBlock):
        return Part(data=_value(dict(block.data)))
    if isinstance(block, MediaBlock) and (block.data is not None or block.url is not None):
        media_type = block.mime_type or "application/octet-stream"
        filename = block.filename if isinstance(block, DocumentBlock) and block.filename else ""
        if block.data is not None:
            return Part(raw=block.data, media_type=media_type, filename=filename)
        return Part(url=block.url, media_type=media_type, filename=filename)
    part = Part(data=_value(content_block_to_dict(block)), media_type="application/json")
    part.metadata.update({PLEXUS_TYPE: block.type})
    return part


def _value(data: Any) -> Value:
    return ParseDict(data, Value())
