"""`OpenAIResponsesModel`: OpenAI's Responses API (``responses.create(stream=True)``) over the official
``openai`` SDK, stateless by default (``store=False``).

Nothing is kept server-side, so every turn sends the whole conversation as input items, and a reasoning
model's reasoning must come back on the next call exactly as it was issued: the reasoning item (its id,
summary and ``encrypted_content``, asked for with ``include=["reasoning.encrypted_content"]``) is kept whole,
as its JSON text, in the `ThinkingBlock`'s ``signature`` — the opaque part a provider needs back, as
Anthropic's thinking signatures are kept — and its summary text in ``content``. The journal stores the
block, so a replayed turn sends the same item. An output item of a type Plexus does not know is kept as an
`UnknownBlock` (``type`` `RESPONSES_ITEM`, the wire item under ``item``) and sent back as it came.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx2

from plexus.core import (
    BaseBlock,
    DocumentBlock,
    FinishReason,
    ImageBlock,
    Item,
    ItemKind,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
    Usage,
)

from ._client import ModelRequest, ToolSpec
from ._convert import CANCELLED_RESULT, blocks_text, media_base64, model_facing_memo
from ._errors import (
    BadRequestError,
    ContextTooLongError,
    ProviderError,
    ProviderProtocolError,
    ProviderUnavailableError,
    RateLimitError,
)
from ._events import (
    BlockEvent,
    FinishEvent,
    ModelEvent,
    ReasoningDeltaEvent,
    ResponseEvent,
    TextDeltaEvent,
    ToolCallDeltaEvent,
    UsageEvent,
)
from ._fold import PrefixFold
from ._noretry import without_retries
from ._openai import _map_error
from ._provenance import OPENAI_RESPONSES
from ._settings import TOOL_CHOICES, ModelSettings, ProviderKwargs, SettingsCache, UnsupportedSettingError

if TYPE_CHECKING:
    import openai

__all__ = ["RESPONSES_ITEM", "OpenAIResponsesModel", "responses_input", "responses_request"]

#: The ``type`` of an `UnknownBlock` holding a Responses output item of a type Plexus does not know.
RESPONSES_ITEM = "openai_responses_item"

_ROLES = {ItemKind.SYSTEM: "system", ItemKind.CONTEXT: "system", ItemKind.DEVELOPER: "developer"}
#: The fields of a Responses request that ``responses.input_tokens.count`` takes (the rest shape the answer).
_COUNTED = ("model", "input", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "text")
_INCOMPLETE = {"max_output_tokens": FinishReason.max_tokens, "content_filter": FinishReason.blocked}


class OpenAIResponsesModel:
    """A `ModelClient` over ``AsyncOpenAI.responses`` with ``stream=True``.

    ``store=False`` (the default) keeps nothing at OpenAI: each call sends the whole transcript and asks for
    the encrypted reasoning back. ``store=True`` lets OpenAI keep the responses (the request is the same).
    """

    def __init__(self, client: openai.AsyncOpenAI, model: str, *, store: bool = False) -> None:
        # The SDK's own retries off, in one copy per client (`_noretry.py`).
        self._client = without_retries(client)
        self._model = model
        self._store = store
        self._settings = SettingsCache(_settings_kwargs)

    @property
    def model(self) -> str:
        return self._model

    def check_settings(self, request: ModelRequest) -> None:
        """Refuse a setting the Responses API cannot honour (`UnsupportedSettingError`); map the rest now."""
        self._settings(request.settings, request.max_tokens, request.temperature)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        import openai  # ≈ 1 s to import: paid only by a process that calls it

        body = _request(self._model, request, self._settings, store=self._store)
        reader = _Reader()
        try:
            events = await self._client.responses.create(**body)
            async for raw in events:
                for event in reader.feed(raw):
                    yield event
        except openai.APIError as exc:
            raise _map_error(exc) from exc
        except httpx2.HTTPError as exc:  # a connection cut mid-stream surfaces from httpx2, unwrapped
            raise ProviderUnavailableError(f"stream broken: {exc!r}", "openai", 0) from exc
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise ProviderProtocolError(f"not a responses stream: {exc!r}"[:500], "openai", 200) from exc
        if not reader.finished:
            # The SDK ends quietly when the body closes early: without response.completed (or incomplete)
            # the turn is broken, not answered.
            raise ProviderUnavailableError("stream ended without a completion event", "openai", 0)

    async def count_tokens(self, request: ModelRequest) -> int:
        """``request``'s input tokens by ``responses.input_tokens.count``: the input items, tools, reasoning
        and output format `stream` would send (`TokenCounter`)."""
        import openai

        body = _request(self._model, request, self._settings, store=self._store)
        try:
            counted = await self._client.responses.input_tokens.count(
                **{k: body[k] for k in _COUNTED if k in body}
            )
            return int(counted.input_tokens)
        except openai.APIError as exc:
            raise _map_error(exc) from exc
        except httpx2.HTTPError as exc:
            raise ProviderUnavailableError(f"count broken: {exc!r}", "openai", 0) from exc
        except (ValueError, TypeError, AttributeError) as exc:
            raise ProviderProtocolError(f"not a token count: {exc!r}"[:500], "openai", 200) from exc


def responses_request(model: str, request: ModelRequest, *, store: bool = False) -> dict[str, Any]:
    """The keyword arguments of ``responses.create`` for ``request``; the caller's to change."""
    return copy.deepcopy(_request(model, request, SettingsCache(_settings_kwargs, size=1), store=store))


def _request(model: str, request: ModelRequest, settings: SettingsCache, *, store: bool) -> dict[str, Any]:
    always, with_tools = settings(request.settings, request.max_tokens, request.temperature)
    body: dict[str, Any] = {"model": model, "input": _input(request.items), "stream": True, "store": store}
    if not store:
        body["include"] = ["reasoning.encrypted_content"]
    body.update(always)
    if request.tools:
        body["tools"] = _tools(request.tools)
        body.update(with_tools)
    if request.output is not None:
        body["text"] = {"format": {"type": "json_schema", **request.output.response_format["json_schema"]}}
    body.update(request.extra)
    return body


def _settings_kwargs(settings: ModelSettings, max_tokens: int, temperature: float | None) -> ProviderKwargs:
    """`ModelSettings` as ``responses.create`` keywords (``extra_body`` is the SDK's own)."""
    s = settings
    for name, why in (
        ("thinking_budget", "is Anthropic's extended thinking (set reasoning_effort instead)"),
        ("seed", "is not a setting of the responses API"),
        ("stop", "is not a setting of the responses API"),
    ):
        if getattr(s, name) is not None:
            raise UnsupportedSettingError(f"{name} {why}; openai responses cannot honour it", name, "openai")
    always: dict[str, Any] = {"max_output_tokens": s.max_tokens if s.max_tokens is not None else max_tokens}
    temperature = s.temperature if s.temperature is not None else temperature
    if temperature is not None:
        always["temperature"] = temperature
    for name in ("top_p", "service_tier"):
        if (value := getattr(s, name)) is not None:
            always[name] = value
    reasoning = {k: v for k, v in (("effort", s.reasoning_effort), ("summary", s.reasoning_summary)) if v}
    if reasoning:
        always["reasoning"] = reasoning
    if s.extra_body:
        always["extra_body"] = dict(s.extra_body)
    with_tools: dict[str, Any] = {}
    if s.parallel_tool_calls is not None:
        with_tools["parallel_tool_calls"] = s.parallel_tool_calls
    if s.tool_choice is not None:
        choice = s.tool_choice
        with_tools["tool_choice"] = choice if choice in TOOL_CHOICES else {"type": "function", "name": choice}
    return always, with_tools


def _tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    # The Responses API makes function tools strict unless told otherwise; a tool's schema need not be.
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": False,
        }
        for t in tools
    ]


# -- the transcript as input items ----------------------------------------------------------------------


def responses_input(items: Sequence[Item]) -> list[dict[str, Any]]:
    """Seed 004 boundary for the Responses API: system-like kinds → ``system``/``developer`` messages; an
    assistant item → its reasoning items (as issued), messages and ``function_call`` items in block order;
    tool results → ``function_call_output`` items; every call answered before the next message (a call left
    unanswered is answered as cancelled). Reasoning of another provider (`_provenance`) is dropped, and so is
    a reasoning item nothing follows (the API refuses one without its following item). The items are the
    caller's."""
    return copy.deepcopy(_input(items))


def _input(items: Sequence[Item]) -> list[dict[str, Any]]:
    conversation = _FOLD(items)
    return [*conversation.input, *(_output(call_id, CANCELLED_RESULT) for call_id in conversation.pending)]


@dataclass
class _Conversation:
    input: list[dict[str, Any]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Parts:
    """One item's contribution: its outputs (by call id), whether it opens new input (earlier calls still
    unanswered are answered first), its input items and the calls it makes."""

    results: list[tuple[str, dict[str, Any]]]
    opens: bool
    entries: list[dict[str, Any]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


def _add(conversation: _Conversation, item: Item) -> None:
    parts = _PARTS(item)
    if parts is None:
        return
    pending = conversation.pending
    for call_id, output in parts.results:
        if call_id in pending:
            pending.remove(call_id)
        conversation.input.append(output)
    if not parts.opens:
        return
    conversation.input.extend(_output(call_id, CANCELLED_RESULT) for call_id in pending)
    pending.clear()
    conversation.input.extend(parts.entries)
    pending.extend(parts.calls)


def _output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def _parts(item: Item) -> _Parts:
    results = [
        (b.call_id, _output(b.call_id, _result_text(b)))
        for b in item.blocks
        if isinstance(b, ToolResultBlock)
    ]
    rest = [b for b in item.blocks if not isinstance(b, ToolResultBlock)]
    if not rest or item.kind is ItemKind.TOOL:
        return _Parts(results, opens=False)
    if (role := _ROLES.get(item.kind)) is not None:
        return _Parts(results, True, [{"role": role, "content": blocks_text(rest)}])
    if item.kind is ItemKind.ASSISTANT:
        entries = _assistant_entries(rest)
        return _Parts(results, True, entries, [b.call_id for b in rest if isinstance(b, ToolUseBlock)])
    return _Parts(results, True, [{"role": "user", "content": [_user_part(b) for b in rest]}])


_PARTS = model_facing_memo(_parts, OPENAI_RESPONSES)
_FOLD = PrefixFold(_Conversation, _add)


def _result_text(result: ToolResultBlock) -> str:
    text = blocks_text(result.content)
    return f"Error: {text}" if result.is_error and not text.startswith("Error") else text


def _assistant_entries(blocks: Sequence[BaseBlock]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            entries.append({"role": "assistant", "content": "".join(text)})
            text.clear()

    for block in blocks:
        if isinstance(block, TextBlock):
            text.append(block.text)
            continue
        entry: dict[str, Any] | None = None
        if isinstance(block, ThinkingBlock):
            entry = _reasoning_item(block)
        elif isinstance(block, ToolUseBlock):
            entry = {
                "type": "function_call",
                "call_id": block.call_id,
                "name": block.tool_name,
                "arguments": json.dumps(block.arguments),
            }
        elif isinstance(block, UnknownBlock) and block.type == RESPONSES_ITEM:
            kept = block.raw.get("item")
            entry = dict(kept) if isinstance(kept, dict) else None
        if entry is not None:
            flush()
            entries.append(entry)
    flush()
    while entries and entries[-1].get("type") == "reasoning":
        entries.pop()  # cut by max_output_tokens after reasoning: refused without its following item
    return entries


def _reasoning_item(block: ThinkingBlock) -> dict[str, Any] | None:
    """The reasoning item kept in ``block``; None for another provider's thinking (not JSON of one)."""
    if not block.signature or not block.signature.startswith("{"):
        return None
    try:
        item = json.loads(block.signature)
    except ValueError:
        return None
    return item if isinstance(item, dict) and item.get("type") == "reasoning" else None


def _user_part(block: BaseBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "input_text", "text": block.text}
    if isinstance(block, ImageBlock):
        inline = media_base64(block)
        url = f"data:{inline[1]};base64,{inline[0]}" if inline else block.url
        if url:
            return {"type": "input_image", "image_url": url, "detail": "auto"}
    if isinstance(block, DocumentBlock):
        inline = media_base64(block)
        if inline:
            part = {"type": "input_file", "file_data": f"data:{inline[1]};base64,{inline[0]}"}
            if block.filename:
                part["filename"] = block.filename
            return part
        if block.file_id:
            return {"type": "input_file", "file_id": block.file_id}
    return {"type": "input_text", "text": blocks_text([block])}


# -- the event stream -------------------------------------------------------------------------------------


class _Reader:
    """Responses stream events → `ModelEvent`s, indexed by ``output_index`` (blocks keep the output order).

    Dispatches on the event's and item's ``type`` strings: the SDK builds an event or item of a type it does
    not know as some other class, so ``isinstance`` would lie."""

    def __init__(self) -> None:
        self.finished = False
        self._calls = False
        self._streamed: set[int] = set()  # output indexes whose text or arguments came as deltas
        self._parts = 0  # unknown content parts kept so far (their own block indexes)

    def feed(self, event: Any) -> list[ModelEvent]:
        kind = event.type
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            self._streamed.add(event.output_index)
            return [TextDeltaEvent(event.delta, index=event.output_index)]
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return [
                ReasoningDeltaEvent(text=event.delta, index=event.output_index, provider=OPENAI_RESPONSES)
            ]
        if kind == "response.reasoning_summary_part.added" and event.summary_index > 0:
            return [ReasoningDeltaEvent(text="\n\n", index=event.output_index, provider=OPENAI_RESPONSES)]
        if kind == "response.function_call_arguments.delta":
            self._streamed.add(event.output_index)
            return [ToolCallDeltaEvent(index=event.output_index, arguments=event.delta)]
        if kind == "response.output_item.added":
            return self._added(event.item, event.output_index)
        if kind == "response.output_item.done":
            return self._done(event.item, event.output_index)
        if kind in ("response.completed", "response.incomplete"):
            self.finished = True
            return self._end(event.response)
        if kind == "response.failed":
            error = event.response.error
            raise _stream_error(
                getattr(error, "code", None), getattr(error, "message", None) or "response failed"
            )
        if kind == "error":
            raise _stream_error(event.code, event.message)
        return []  # progress events: whatever they describe arrives whole in output_item.done

    def _added(self, item: Any, index: int) -> list[ModelEvent]:
        if item.type == "function_call":
            self._calls = True
            return [ToolCallDeltaEvent(index=index, call_id=item.call_id, name=item.name)]
        if item.type == "reasoning":
            return [ReasoningDeltaEvent(index=index, provider=OPENAI_RESPONSES)]  # its place among the blocks
        return []

    def _done(self, item: Any, index: int) -> list[ModelEvent]:
        if item.type == "reasoning":
            # The whole item, from .done (.added's encrypted content may be incomplete), as sent back.
            signature = json.dumps(item.to_dict(), separators=(",", ":"), ensure_ascii=False)
            return [ReasoningDeltaEvent(signature=signature, index=index, provider=OPENAI_RESPONSES)]
        if item.type == "function_call":
            self._calls = True
            call = ToolCallDeltaEvent(index=index, call_id=item.call_id, name=item.name)
            if index in self._streamed:
                return [call]
            return [call, ToolCallDeltaEvent(index=index, arguments=item.arguments or "")]
        if item.type == "message":
            return self._message(item, index)
        raw = {"type": RESPONSES_ITEM, "item": item.to_dict()}
        return [BlockEvent(UnknownBlock.from_dict(raw), index=index)]

    def _message(self, item: Any, index: int) -> list[ModelEvent]:
        events: list[ModelEvent] = []
        for part in item.content or ():
            if part.type in ("output_text", "refusal"):
                if index not in self._streamed:  # a server that sent the message whole
                    events.append(
                        TextDeltaEvent(part.text if part.type == "output_text" else part.refusal, index)
                    )
                continue
            self._parts += 1
            raw = {"type": RESPONSES_ITEM, "part": part.to_dict()}
            events.append(BlockEvent(UnknownBlock.from_dict(raw), index=-self._parts))
        return events

    def _end(self, response: Any) -> list[ModelEvent]:
        events: list[ModelEvent] = [ResponseEvent(response.id or None, response.model or None)]
        if response.usage is not None:
            events.append(UsageEvent(_usage(response.usage)))
        if response.status == "incomplete":
            details = response.incomplete_details
            reason = (
                (getattr(details, "reason", None) or "incomplete") if details is not None else "incomplete"
            )
            make = _INCOMPLETE.get(reason)
            events.append(FinishEvent(make(reason) if make is not None else FinishReason.other(reason)))
        elif self._calls:
            events.append(FinishEvent(FinishReason.tool_call(response.status or "completed")))
        else:
            events.append(FinishEvent(FinishReason.completed(response.status or "completed")))
        return events


def _usage(u: Any) -> Usage:
    input_details = getattr(u, "input_tokens_details", None)
    output_details = getattr(u, "output_tokens_details", None)
    return Usage(
        input_tokens=u.input_tokens or 0,
        cached_tokens=(getattr(input_details, "cached_tokens", None) or 0) if input_details else 0,
        output_tokens=u.output_tokens or 0,
        reasoning_tokens=(getattr(output_details, "reasoning_tokens", None) or 0) if output_details else 0,
    )


def _stream_error(code: str | None, message: str) -> ProviderError:
    """An error the server reported inside a 200 stream (an ``error`` event, ``response.failed``)."""
    code = code or ""
    if "rate_limit" in code:
        return RateLimitError(message, "openai", 429)
    if "context_length" in code:
        return ContextTooLongError(message, "openai", 400)
    if code.startswith("invalid") or code in ("bad_request", "invalid_prompt"):
        return BadRequestError(message, "openai", 400)
    return ProviderUnavailableError(f"{code or 'error'}: {message}", "openai", 0)
