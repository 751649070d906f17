"""`AnthropicModel`: the Messages API over the official ``anthropic`` SDK (transport, retries, SSE are its).

Seed 004 rules for this wire format: system-like items go to the top-level ``system``; tool results travel
as ``tool_result`` blocks in ONE user message, placed before any text, and every ``tool_use`` is answered;
thinking blocks go back verbatim with their ``signature`` (redacted ones as ``redacted_thinking``), and
reasoning another provider made (`_provenance`), or of unknown origin without a signature, is dropped
because the API would refuse it.
"""

from __future__ import annotations

import copy
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
    ToolPairing,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)

from ._client import ModelRequest, ToolSpec
from ._convert import CANCELLED_RESULT, blocks_text, media_base64, model_facing_memo
from ._errors import (
    AuthenticationError,
    BadRequestError,
    ContextTooLongError,
    ProviderError,
    ProviderProtocolError,
    ProviderUnavailableError,
    RateLimitError,
)
from ._events import (
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
from ._openai import _retry_after
from ._output import anthropic_output
from ._provenance import ANTHROPIC
from ._settings import ModelSettings, ProviderKwargs, SettingsCache, UnsupportedSettingError

if TYPE_CHECKING:
    import anthropic

__all__ = ["AnthropicModel", "anthropic_messages", "anthropic_request", "anthropic_tools"]

_SYSTEM_KINDS = (ItemKind.SYSTEM, ItemKind.DEVELOPER, ItemKind.CONTEXT)
_TOOL_CHOICES = {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"}}
_SERVICE_TIERS = ("auto", "standard_only")
#: The fields of a Messages request that ``messages.count_tokens`` takes (the rest shape the answer only).
_COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking")


class AnthropicModel:
    """A `ModelClient` over ``AsyncAnthropic.messages.create(stream=True)``, reading the raw events."""

    def __init__(self, client: anthropic.AsyncAnthropic, model: str) -> None:
        # The SDK's own retries off, in one copy per client (`_noretry.py`).
        self._client = without_retries(client)
        self._model = model
        self._settings = SettingsCache(_settings_kwargs)

    @property
    def model(self) -> str:
        return self._model

    def check_settings(self, request: ModelRequest) -> None:
        """Refuse a setting of ``request`` the Messages API cannot honour (`UnsupportedSettingError`), and map
        its settings now: `LLMAgent` calls this when built, so its turns find them mapped."""
        self._settings(request.settings, request.max_tokens, request.temperature)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        # Imported here, not at the top: the SDK takes ≈ 2.5 s to import, paid only by a process that calls it
        # (whoever built the client has imported it already).
        import anthropic

        body = _request(self._model, request, self._settings)
        parser = _EventParser()
        try:
            events = await self._client.messages.create(**body)
            async for raw in events:
                for event in parser.feed(raw):
                    yield event
        except anthropic.APIError as exc:
            raise _map_error(exc) from exc
        except httpx2.HTTPError as exc:
            raise ProviderUnavailableError(f"stream broken: {exc!r}", "anthropic", 0) from exc
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            # Garbage on the wire (bad JSON, events of the wrong shape) must not surface as a bare exception.
            raise ProviderProtocolError(f"not a anthropic stream: {exc!r}"[:500], "anthropic", 200) from exc
        if not parser.stopped:
            raise ProviderUnavailableError("stream ended before message_stop", "anthropic", 0)

    async def count_tokens(self, request: ModelRequest) -> int:
        """``request``'s input tokens by ``messages.count_tokens`` (free, rate-limited apart): the messages,
        system, tools and thinking `stream` would send (`TokenCounter`)."""
        import anthropic

        body = _request(self._model, request, self._settings)
        try:
            counted = await self._client.messages.count_tokens(**{k: body[k] for k in _COUNTED if k in body})
            return int(counted.input_tokens)
        except anthropic.APIError as exc:
            raise _map_error(exc) from exc
        except httpx2.HTTPError as exc:
            raise ProviderUnavailableError(f"count broken: {exc!r}", "anthropic", 0) from exc
        except (ValueError, TypeError, AttributeError) as exc:
            raise ProviderProtocolError(f"not a token count: {exc!r}"[:500], "anthropic", 200) from exc


def anthropic_request(model: str, request: ModelRequest) -> dict[str, Any]:
    """The JSON body (as keyword arguments of ``messages.create``) for ``request``; the caller's to change."""
    return copy.deepcopy(_request(model, request, SettingsCache(_settings_kwargs, size=1)))


def _request(model: str, request: ModelRequest, settings: SettingsCache) -> dict[str, Any]:
    """`anthropic_request`, sharing its parts with the per-item memo, the tools and the settings' mapping
    (what `stream` sends)."""
    always, with_tools = settings(request.settings, request.max_tokens, request.temperature)
    system, messages = _messages(request.items)
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": True, **always}
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = anthropic_tools(request.tools)
        body.update(with_tools)
    if request.output is not None:
        anthropic_output(body, request.output, with_tools, request.settings)
    body.update(request.extra)
    return body


def _refuse(setting: str, why: str) -> UnsupportedSettingError:
    return UnsupportedSettingError(f"{setting} {why}", setting, "anthropic")


def _settings_kwargs(settings: ModelSettings, max_tokens: int, temperature: float | None) -> ProviderKwargs:
    """`ModelSettings` as ``messages.create`` keywords (``extra_body`` is the SDK's own)."""
    s = settings
    if s.seed is not None:
        raise _refuse("seed", "is not a setting of the anthropic messages API")
    if s.reasoning_effort is not None:
        raise _refuse("reasoning_effort", "is OpenAI's; anthropic thinks with a budget (set thinking_budget)")
    if s.reasoning_summary is not None:
        raise _refuse(
            "reasoning_summary", "is the OpenAI Responses API's; anthropic streams its thinking as is"
        )
    if s.service_tier is not None and s.service_tier not in _SERVICE_TIERS:
        raise _refuse("service_tier", f"{s.service_tier!r} is not one of anthropic's {_SERVICE_TIERS}")
    limit = s.max_tokens if s.max_tokens is not None else max_tokens
    temperature = s.temperature if s.temperature is not None else temperature
    always: dict[str, Any] = {"max_tokens": limit}
    if s.thinking_budget is not None:
        # The API's rules for extended thinking, refused here rather than by a 400 on every call.
        if s.thinking_budget >= limit:
            raise _refuse(
                "thinking_budget", f"({s.thinking_budget}) must be below max_tokens ({limit}) on anthropic"
            )
        if temperature is not None and temperature != 1:
            raise _refuse(
                "temperature", "cannot be changed with extended thinking (thinking_budget) on anthropic"
            )
        if s.top_p is not None and s.top_p < 0.95:
            raise _refuse(
                "top_p", "must be at least 0.95 with extended thinking (thinking_budget) on anthropic"
            )
        if s.tool_choice not in (None, "auto", "none"):
            raise _refuse(
                "tool_choice",
                "can only be auto or none with extended thinking (thinking_budget) on anthropic",
            )
        always["thinking"] = {"type": "enabled", "budget_tokens": s.thinking_budget}
    if s.stop is not None:
        always["stop_sequences"] = list(s.stop)
    if s.service_tier is not None:
        always["service_tier"] = s.service_tier
    # The SDK's ``messages.create`` has no temperature or top_p keywords (any more): they go in its
    # ``extra_body``, which it merges into the JSON body under these same names.
    extra: dict[str, Any] = {}
    if temperature is not None:
        extra["temperature"] = temperature
    if s.top_p is not None:
        extra["top_p"] = s.top_p
    extra.update(s.extra_body or {})
    if extra:
        always["extra_body"] = extra
    with_tools: dict[str, Any] = {}
    if s.tool_choice is not None or s.parallel_tool_calls is not None:
        choice = s.tool_choice or "auto"
        tool_choice: dict[str, Any] = dict(_TOOL_CHOICES.get(choice) or {"type": "tool", "name": choice})
        # {"type": "none"} takes no disable_parallel_tool_use (no call, nothing in parallel).
        if s.parallel_tool_calls is not None and choice != "none":
            tool_choice["disable_parallel_tool_use"] = not s.parallel_tool_calls
        with_tools["tool_choice"] = tool_choice
    return always, with_tools


def anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def anthropic_messages(items: Sequence[Item]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, messages) for ``items``; consecutive same-role turns are merged into one message. The
    caller's to change."""
    return copy.deepcopy(_messages(items))


def _messages(items: Sequence[Item]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`anthropic_messages`, its blocks shared with the per-item memo (the request body only)."""
    conversation = _FOLD(items)
    messages = list(conversation.messages)
    role, results, rest = conversation.role, conversation.results, conversation.rest
    if conversation.pending:  # calls never answered: answered as cancelled, in a user turn
        cancelled = [_cancelled(call_id) for call_id in conversation.pending]
        if role == "user":
            results = [*results, *cancelled]
        else:
            if results or rest:
                messages.append({"role": role, "content": [*results, *rest]})
            role, results, rest = "user", cancelled, []
    if results or rest:
        messages.append({"role": role, "content": [*results, *rest]})
    return list(conversation.system), messages


@dataclass
class _Conversation:
    """The system blocks and messages of the items so far. The last turn stays open (``role``, its
    tool_result blocks, its other blocks; results must come first): the next item of the same role merges
    into it. ``pending``: calls of the last assistant turn without a result yet."""

    pairing: ToolPairing = field(default_factory=ToolPairing)
    system: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    role: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    rest: list[dict[str, Any]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)

    def turn(self, role: str) -> None:
        """Make ``role``'s turn the open one (closing the other: an empty one sends nothing)."""
        if self.role == role:
            return
        if self.results or self.rest:
            self.messages.append({"role": self.role, "content": [*self.results, *self.rest]})
        self.role, self.results, self.rest = role, [], []

    def answer_pending(self) -> None:
        if self.pending:
            self.turn("user")
            self.results.extend(_cancelled(call_id) for call_id in self.pending)
            self.pending.clear()


def _cancelled(call_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": CANCELLED_RESULT, "is_error": True}


def _add(conversation: _Conversation, item: Item) -> None:
    conversation.pairing.add(item)
    parts = _PARTS(item)
    if parts is None:
        return  # no model sees it
    if parts.system is not None:
        conversation.system.append(parts.system)
        return
    if parts.assistant:
        conversation.answer_pending()
        if parts.content:
            conversation.turn("assistant")
            conversation.rest.extend(parts.content)
        conversation.pending.extend(parts.calls)
        return
    conversation.turn("user")
    pending = conversation.pending
    for call_id, result in parts.results:
        if call_id in pending:
            pending.remove(call_id)
        conversation.results.append(result)
    conversation.rest.extend(parts.content)
    if parts.answers:
        conversation.answer_pending()


@dataclass(frozen=True)
class _Parts:
    """What one model-facing item contributes, whatever surrounds it: a system block; or an assistant turn's
    blocks and the calls it makes; or a user turn's tool results (by call id) and other blocks, and whether
    it answers the calls still unanswered (any user item but a TOOL one)."""

    system: dict[str, Any] | None = None
    assistant: bool = False
    content: list[dict[str, Any]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    answers: bool = False


def _parts(item: Item) -> _Parts:
    if item.kind in _SYSTEM_KINDS:
        return _Parts(system={"type": "text", "text": blocks_text(item.blocks)})
    if item.kind is ItemKind.ASSISTANT:
        content = [c for b in item.blocks if (c := _assistant_block(b)) is not None]
        calls = [b.call_id for b in item.blocks if isinstance(b, ToolUseBlock)]
        return _Parts(assistant=True, content=content, calls=calls)
    tool = item.kind is ItemKind.TOOL
    return _Parts(
        content=[] if tool else [_user_block(b) for b in item.blocks if not isinstance(b, ToolResultBlock)],
        results=[(b.call_id, _tool_result(b)) for b in item.blocks if isinstance(b, ToolResultBlock)],
        answers=not tool,
    )


#: Each model-facing item converted once while it lives: a turn converts only the items new since the last.
_PARTS = model_facing_memo(_parts, ANTHROPIC)
#: Each conversation's system blocks and messages so far: a turn adds only its new items to the last turn's.
_FOLD = PrefixFold(_Conversation, _add)


def _assistant_block(block: BaseBlock) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text} if block.text else None
    if isinstance(block, ThinkingBlock):
        if not block.signature:
            return None
        if block.redacted:
            return {"type": "redacted_thinking", "data": block.signature}
        return {"type": "thinking", "thinking": block.content, "signature": block.signature}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.call_id, "name": block.tool_name, "input": block.arguments}
    return {"type": "text", "text": blocks_text([block])}


def _tool_result(block: ToolResultBlock) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for part in block.content:
        if isinstance(part, ImageBlock) and (source := _source(part)) is not None:
            content.append({"type": "image", "source": source})
        elif text := blocks_text(
            [part]
        ):  # Anthropic refuses an empty text block (a tool returning "" or None)
            content.append({"type": "text", "text": text})
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.call_id}
    if content:  # a result without content is valid; an empty text block is not
        result["content"] = content
    if block.is_error:
        result["is_error"] = True
    return result


def _source(block: ImageBlock | DocumentBlock) -> dict[str, Any] | None:
    inline = media_base64(block)
    if inline is not None:
        return {"type": "base64", "media_type": inline[1], "data": inline[0]}
    if block.url:
        return {"type": "url", "url": block.url}
    if block.file_id:
        return {"type": "file", "file_id": block.file_id}
    return None


def _user_block(block: BaseBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageBlock | DocumentBlock) and (source := _source(block)) is not None:
        kind = "image" if isinstance(block, ImageBlock) else "document"
        return {"type": kind, "source": source}
    return {"type": "text", "text": blocks_text([block])}  # audio/video: the Messages API takes none


class _EventParser:
    """Raw Messages stream events → `ModelEvent`s (usage is input at message_start + output at the end)."""

    def __init__(self) -> None:
        self.stopped = False
        self._input = Usage()

    def feed(self, raw: Any) -> list[ModelEvent]:
        kind = raw.type
        if kind == "message_start":
            u = raw.message.usage
            read = getattr(u, "cache_read_input_tokens", None) or 0
            write = getattr(u, "cache_creation_input_tokens", None) or 0
            # Anthropic's input_tokens exclude cache reads and writes; Plexus's include them.
            self._input = Usage(
                input_tokens=(u.input_tokens or 0) + read + write,
                cached_tokens=read,
                cache_write_tokens=write,
            )
            return [UsageEvent(self._input), ResponseEvent(raw.message.id or None, raw.message.model or None)]
        if kind == "content_block_start":
            block = raw.content_block
            if block.type == "tool_use":
                return [ToolCallDeltaEvent(index=raw.index, call_id=block.id, name=block.name)]
            if block.type == "text" and block.text:
                return [TextDeltaEvent(block.text, raw.index)]
            if block.type == "thinking":
                return [
                    ReasoningDeltaEvent(
                        text=block.thinking or "",
                        signature=block.signature or "",
                        index=raw.index,
                        provider=ANTHROPIC,
                    )
                ]
            if block.type == "redacted_thinking":
                return [
                    ReasoningDeltaEvent(
                        signature=block.data, index=raw.index, redacted=True, provider=ANTHROPIC
                    )
                ]
            return []
        if kind == "content_block_delta":
            delta = raw.delta
            if delta.type == "text_delta":
                return [TextDeltaEvent(delta.text, raw.index)]
            if delta.type == "input_json_delta":
                return [ToolCallDeltaEvent(index=raw.index, arguments=delta.partial_json)]
            if delta.type == "thinking_delta":
                return [ReasoningDeltaEvent(text=delta.thinking, index=raw.index, provider=ANTHROPIC)]
            if delta.type == "signature_delta":
                return [ReasoningDeltaEvent(signature=delta.signature, index=raw.index, provider=ANTHROPIC)]
            return []
        if kind == "message_delta":
            out: list[ModelEvent] = []
            output = getattr(raw.usage, "output_tokens", None) or 0
            out.append(UsageEvent(self._input + Usage(output_tokens=output)))
            if raw.delta.stop_reason:
                out.append(FinishEvent(FinishReason.from_provider("anthropic", raw.delta.stop_reason)))
            return out
        if kind == "message_stop":
            self.stopped = True
        return []


def _map_error(exc: anthropic.APIError) -> ProviderError:
    import anthropic

    message = str(getattr(exc, "message", "") or exc)
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        if status < 300:
            # An `error` event after the 200 (e.g. overloaded mid-stream): the SDK raises it with the stream's
            # status, so its documented error type says what it is.
            return _mid_stream_error(message, _error_type(exc.body), status)
        if isinstance(exc, anthropic.RateLimitError):
            return RateLimitError(message, "anthropic", status, _retry_after(exc.response))
        if isinstance(exc, anthropic.AuthenticationError | anthropic.PermissionDeniedError):
            return AuthenticationError(message, "anthropic", status)
        if status in (400, 413) and "too long" in message.lower():
            return ContextTooLongError(message, "anthropic", status)
        if status >= 500:
            return ProviderUnavailableError(message, "anthropic", status)
        return BadRequestError(message, "anthropic", status)
    return ProviderUnavailableError(message, "anthropic", 0)


def _error_type(body: object) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else ""


def _mid_stream_error(message: str, kind: str, status: int) -> ProviderError:
    if kind == "rate_limit_error":
        return RateLimitError(message, "anthropic", status)
    if kind in ("authentication_error", "permission_error"):
        return AuthenticationError(message, "anthropic", status)
    if kind in ("invalid_request_error", "not_found_error", "request_too_large"):
        return BadRequestError(message, "anthropic", status)
    # overloaded_error, api_error, and a type this adapter does not know: the provider failed the answer
    # it had begun; asking again later may succeed.
    return ProviderUnavailableError(message, "anthropic", status)
