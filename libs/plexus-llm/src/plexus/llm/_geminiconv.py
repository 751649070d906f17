"""The seed 004 boundary for Gemini: a transcript as ``google-genai`` ``Content``s and a system instruction.

How a Gemini turn is kept in Plexus blocks, and sent back (`GeminiModel` makes the blocks, this module reads
them):

- a text part is a `TextBlock`, a thought part (``thought: true``, a thought summary) a `ThinkingBlock`, a
  function call a `ToolUseBlock`;
- a part's ``thoughtSignature`` (bytes on the SDK's types) is a `ThinkingBlock` of its own right **after**
  that part: ``content=""``, ``redacted=True``, ``signature`` = the bytes as standard base64. Going back, it
  is put on the part just before it, unchanged; one with no part to carry it (the first block, or after a
  part that already has one) goes back as an empty text part carrying it, as the stream delivered it;
- a part Plexus has no block for (code execution, a server-side tool call, a part type the SDK does not
  know) is an `UnknownBlock` of type `GEMINI_PART` holding the part's JSON, and goes back as it is.

Reasoning another provider made (`_provenance`) is never sent, neither as a thought nor as a signature.
Parts are never merged across signatures, so a signature stays on the part it came with. Function responses
name their call (Gemini pairs them by name, and by id when it sent one); ids Plexus made for calls that came
without one (`GEMINI_CALL_ID_PREFIX`) are never sent. Every call is answered: one left without a result is
answered as cancelled.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plexus.core import (
    BaseBlock,
    Item,
    ItemKind,
    MediaBlock,
    TextBlock,
    ThinkingBlock,
    ToolPairing,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
)

from ._convert import CANCELLED_RESULT, blocks_text, model_facing_memo
from ._fold import PrefixFold
from ._provenance import GEMINI

if TYPE_CHECKING:
    from google.genai import types

__all__ = ["GEMINI_CALL_ID_PREFIX", "GEMINI_PART", "gemini_contents"]

#: ``type`` of an `UnknownBlock` holding a Gemini part Plexus has no block for (``raw["part"]``: its JSON).
GEMINI_PART = "gemini_part"
#: Prefix of the ids Plexus gives function calls Gemini sent without one; such ids never go back.
GEMINI_CALL_ID_PREFIX = "plx-gemini-"

_SYSTEM_KINDS = (ItemKind.SYSTEM, ItemKind.DEVELOPER, ItemKind.CONTEXT)


def signature_bytes(signature: str) -> bytes | None:
    """A signature block's bytes; None for one that is not base64 (another provider's), which is dropped."""
    try:
        return base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True)
class _Parts:
    """What one model-facing item contributes: system parts, or a content's role and parts (None: none),
    the calls it makes (id, name) and the results it carries (call id, text, is_error)."""

    system: list[types.Part] = field(default_factory=list)
    role: str | None = None
    parts: list[types.Part] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    results: list[tuple[str, str, bool]] = field(default_factory=list)


def _parts(item: Item) -> _Parts:
    from google.genai import types

    results = [
        (b.call_id, blocks_text(b.content), b.is_error) for b in item.blocks if isinstance(b, ToolResultBlock)
    ]
    rest = [b for b in item.blocks if not isinstance(b, ToolResultBlock)]
    if item.kind is ItemKind.TOOL or not rest:
        return _Parts(results=results)
    if item.kind in _SYSTEM_KINDS:
        return _Parts(system=[types.Part(text=blocks_text(rest))], results=results)
    if item.kind is ItemKind.ASSISTANT:
        parts = _model_parts(rest)
        calls = [(b.call_id, b.tool_name) for b in rest if isinstance(b, ToolUseBlock)]
        return _Parts(role="model" if parts else None, parts=parts, calls=calls, results=results)
    return _Parts(role="user", parts=[_user_part(b) for b in rest], results=results)


def _model_parts(blocks: Sequence[BaseBlock]) -> list[types.Part]:
    from google.genai import types

    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, ThinkingBlock) and block.redacted and not block.content:
            raw = signature_bytes(block.signature or "")
            if raw is None:
                continue
            if parts and "thought_signature" not in parts[-1]:
                parts[-1]["thought_signature"] = raw  # the part it arrived with
            else:
                parts.append({"text": "", "thought_signature": raw})
        elif isinstance(block, ThinkingBlock):
            if block.content:
                parts.append({"text": block.content, "thought": True})
        elif isinstance(block, TextBlock):
            parts.append({"text": block.text})
        elif isinstance(block, ToolUseBlock):
            call: dict[str, Any] = {"name": block.tool_name, "args": block.arguments}
            if not block.call_id.startswith(GEMINI_CALL_ID_PREFIX):
                call["id"] = block.call_id
            parts.append({"function_call": types.FunctionCall(**call)})
        elif isinstance(block, UnknownBlock) and block.type == GEMINI_PART:
            part = block.raw.get("part")
            if isinstance(part, dict) and part:
                parts.append({"_part": types.Part.model_validate(part)})
        else:
            parts.append({"text": blocks_text([block])})
    return [p["_part"] if "_part" in p else types.Part(**p) for p in parts]


def _user_part(block: BaseBlock) -> types.Part:
    from google.genai import types

    if isinstance(block, TextBlock):
        return types.Part(text=block.text)
    if isinstance(block, MediaBlock):
        mime = block.mime_type or "application/octet-stream"
        if block.data is not None:
            return types.Part(inline_data=types.Blob(data=block.data, mime_type=mime))
        if block.url is not None:
            return types.Part(file_data=types.FileData(file_uri=block.url, mime_type=mime))
    return types.Part(text=blocks_text([block]))


@dataclass
class _Conversation:
    """The contents of the items so far, but for the answers of the calls still ``pending`` (the last model
    content's calls without a response): a later item may answer them yet."""

    pairing: ToolPairing = field(default_factory=ToolPairing)
    system: list[types.Part] = field(default_factory=list)
    contents: list[types.Content] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    #: the content of function responses answering the last model content, while no other content followed
    responses: types.Content | None = None


def _response(conversation: _Conversation, call_id: str, text: str, is_error: bool) -> types.Part:
    from google.genai import types

    fields: dict[str, Any] = {
        "name": conversation.names.get(call_id, ""),
        "response": {"error" if is_error else "output": text},
    }
    if not call_id.startswith(GEMINI_CALL_ID_PREFIX):
        fields["id"] = call_id
    return types.Part(function_response=types.FunctionResponse(**fields))


def _answer(conversation: _Conversation, call_id: str, text: str, is_error: bool) -> None:
    """Add a function response to the content answering the last model content (opened by the first)."""
    from google.genai import types

    if conversation.responses is None:
        conversation.responses = types.Content(role="user", parts=[])
        conversation.contents.append(conversation.responses)
    assert conversation.responses.parts is not None
    conversation.responses.parts.append(_response(conversation, call_id, text, is_error))


def _add(conversation: _Conversation, item: Item) -> None:
    from google.genai import types

    conversation.pairing.add(item)
    parts = _PARTS(item)
    if parts is None:
        return  # no model sees it
    conversation.system.extend(parts.system)
    for call_id, text, is_error in parts.results:
        if call_id in conversation.pending:
            conversation.pending.remove(call_id)
        _answer(conversation, call_id, text, is_error)
    if parts.role is None:
        return
    for call_id in conversation.pending:  # unanswered before the next content: answered as cancelled
        _answer(conversation, call_id, CANCELLED_RESULT, True)
    conversation.pending.clear()
    conversation.responses = None
    conversation.contents.append(types.Content(role=parts.role, parts=parts.parts))
    for call_id, name in parts.calls:
        conversation.names[call_id] = name
        conversation.pending.append(call_id)


#: Each model-facing item converted once while it lives: a turn converts only the items new since the last.
_PARTS = model_facing_memo(_parts, GEMINI)
#: Each conversation's contents so far: a turn adds only its new items to the last turn's.
_FOLD = PrefixFold(_Conversation, _add)


def gemini_contents(items: Sequence[Item]) -> tuple[types.Content | None, list[types.Content]]:
    """(system instruction, contents) for ``items``; the SDK's objects share parts with the per-item memo,
    so a caller that changes them copies them first (``model_copy(deep=True)``)."""
    from google.genai import types

    conversation = _FOLD(items)
    contents = list(conversation.contents)
    if conversation.pending:
        cancelled = [_response(conversation, c, CANCELLED_RESULT, True) for c in conversation.pending]
        if conversation.responses is not None:
            contents[-1] = types.Content(
                role="user", parts=[*(conversation.responses.parts or []), *cancelled]
            )
        else:
            contents.append(types.Content(role="user", parts=cancelled))
    system = types.Content(parts=list(conversation.system)) if conversation.system else None
    return system, contents
