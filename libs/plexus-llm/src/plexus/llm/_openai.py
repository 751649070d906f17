"""`OpenAIChatModel`: OpenAI-compatible Chat Completions (OpenAI, vLLM, Ollama, LM Studio: any ``base_url``)
over the official ``openai`` SDK, which owns the transport, retries and SSE parsing."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import httpx2

from plexus.core import (
    AudioBlock,
    BaseBlock,
    DocumentBlock,
    FinishReason,
    ImageBlock,
    Item,
    ItemKind,
    JsonValue,
    TextBlock,
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
from ._output import openai_response_format
from ._provenance import OPENAI_CHAT
from ._settings import TOOL_CHOICES, ModelSettings, ProviderKwargs, SettingsCache, UnsupportedSettingError

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIChatModel", "openai_messages", "openai_request", "openai_tools"]

_SYSTEM_KINDS = (ItemKind.SYSTEM, ItemKind.DEVELOPER, ItemKind.CONTEXT)
_AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


MaxTokensField = Literal["max_tokens", "max_completion_tokens"]


class OpenAIChatModel:
    """A `ModelClient` over ``AsyncOpenAI.chat.completions`` with ``stream=True``.

    ``max_tokens_field``: the wire name of the output limit. ``max_tokens`` (the default) is what the
    compatible servers (vLLM, Ollama, LM Studio) know; OpenAI's own API has deprecated it for
    ``max_completion_tokens`` and its reasoning models refuse it.
    """

    def __init__(
        self, client: openai.AsyncOpenAI, model: str, *, max_tokens_field: MaxTokensField = "max_tokens"
    ) -> None:
        # The SDK's own retries off, in one copy per client (`_noretry.py`).
        self._client = without_retries(client)
        self._model = model
        self._settings = SettingsCache(functools.partial(_settings_kwargs, max_tokens_field))

    @property
    def model(self) -> str:
        return self._model

    def check_settings(self, request: ModelRequest) -> None:
        """Refuse a setting of ``request`` Chat Completions cannot honour (`UnsupportedSettingError`), and map
        its settings now: `LLMAgent` calls this when built, so its turns find them mapped."""
        self._settings(request.settings, request.max_tokens, request.temperature)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        # Imported here, not at the top: the SDK takes ≈ 1 s to import, paid only by a process that calls it
        # (whoever built the client has imported it already).
        import openai

        body = _request(self._model, request, self._settings)
        finished = False
        try:
            chunks = await self._client.chat.completions.create(**body)
            async for chunk in chunks:
                for event in _chunk_events(chunk):
                    finished = finished or isinstance(event, FinishEvent)
                    yield event
        except openai.APIError as exc:
            raise _map_error(exc) from exc
        except httpx2.HTTPError as exc:  # a connection cut mid-stream surfaces from httpx2, unwrapped
            raise ProviderUnavailableError(f"stream broken: {exc!r}", "openai", 0) from exc
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            # Garbage on the wire (bad JSON, events of the wrong shape) must not surface as a bare exception.
            raise ProviderProtocolError(f"not a openai stream: {exc!r}"[:500], "openai", 200) from exc
        if not finished:
            # The SDK ends quietly when the server closes the body early; a turn without a finish reason
            # is a broken stream, not a completed answer.
            raise ProviderUnavailableError("stream ended without a finish reason", "openai", 0)


def openai_request(
    model: str, request: ModelRequest, *, max_tokens_field: MaxTokensField = "max_tokens"
) -> dict[str, Any]:
    """The JSON body (as keyword arguments of ``chat.completions.create``) for ``request``; the caller's to
    change."""
    settings = SettingsCache(functools.partial(_settings_kwargs, max_tokens_field), size=1)
    return copy.deepcopy(_request(model, request, settings))


def _request(model: str, request: ModelRequest, settings: SettingsCache) -> dict[str, Any]:
    """`openai_request`, sharing its parts with the per-item memo, the tools and the settings' mapping (what
    `stream` sends)."""
    always, with_tools = settings(request.settings, request.max_tokens, request.temperature)
    body: dict[str, Any] = {
        "model": model,
        "messages": _messages(request.items),
        "stream": True,
        "stream_options": {"include_usage": True},
        **always,
    }
    if request.tools:
        body["tools"] = openai_tools(request.tools)
        body.update(with_tools)
    if request.output is not None:
        body.update(openai_response_format(request.output))
    body.update(request.extra)
    return body


def _settings_kwargs(
    max_tokens_field: str, settings: ModelSettings, max_tokens: int, temperature: float | None
) -> ProviderKwargs:
    """`ModelSettings` as ``chat.completions.create`` keywords (``extra_body`` is the SDK's own)."""
    if settings.thinking_budget is not None:
        raise UnsupportedSettingError(
            "thinking_budget is Anthropic's extended thinking; openai chat completions has none (set "
            "reasoning_effort instead)",
            "thinking_budget",
            "openai",
        )
    if settings.reasoning_summary is not None:
        raise UnsupportedSettingError(
            "reasoning_summary is the OpenAI Responses API's; openai chat completions streams no "
            "summaries (use OpenAIResponsesModel)",
            "reasoning_summary",
            "openai",
        )
    s = settings
    always: dict[str, Any] = {max_tokens_field: s.max_tokens if s.max_tokens is not None else max_tokens}
    temperature = s.temperature if s.temperature is not None else temperature
    if temperature is not None:
        always["temperature"] = temperature
    for name in ("top_p", "seed", "reasoning_effort", "service_tier"):
        if (value := getattr(s, name)) is not None:
            always[name] = value
    if s.stop is not None:
        always["stop"] = list(s.stop)
    if s.extra_body:
        always["extra_body"] = dict(s.extra_body)
    # The API refuses both without tools: they are added only to a request offering some.
    with_tools: dict[str, Any] = {}
    if s.parallel_tool_calls is not None:
        with_tools["parallel_tool_calls"] = s.parallel_tool_calls
    if s.tool_choice is not None:
        choice = s.tool_choice
        with_tools["tool_choice"] = (
            choice if choice in TOOL_CHOICES else {"type": "function", "function": {"name": choice}}
        )
    return always, with_tools


def openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def openai_messages(items: Sequence[Item]) -> list[dict[str, Any]]:
    """Seed 004 boundary for Chat Completions: system-like kinds → ``system``; tool results → one ``tool``
    message per call; every ``tool_call_id`` answered before the next non-tool message; thinking dropped
    (Chat Completions has no field for it). The messages are the caller's to change."""
    return copy.deepcopy(_messages(items))


def _messages(items: Sequence[Item]) -> list[dict[str, Any]]:
    """`openai_messages`, its message objects shared with the per-item memo (the request body only)."""
    conversation = _FOLD(items)
    cancelled = [
        {"role": "tool", "tool_call_id": call_id, "content": CANCELLED_RESULT}
        for call_id in conversation.pending
    ]
    return [*conversation.messages, *cancelled]


@dataclass
class _Conversation:
    """The messages of the items so far, but for the answers of the calls still ``pending`` (the last
    assistant message's calls without a tool message): a later item may answer them yet."""

    pairing: ToolPairing = field(default_factory=ToolPairing)
    messages: list[dict[str, Any]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)


def _add(conversation: _Conversation, item: Item) -> None:
    conversation.pairing.add(item)
    parts = _PARTS(item)
    if parts is None:
        return  # no model sees it
    messages, pending = conversation.messages, conversation.pending
    for call_id, message in parts.results:
        if call_id in pending:
            pending.remove(call_id)
        messages.append(message)
    if not parts.opens:
        return
    for call_id in pending:  # unanswered before the next message: answered as cancelled
        messages.append({"role": "tool", "tool_call_id": call_id, "content": CANCELLED_RESULT})
    pending.clear()
    if parts.message is not None:
        messages.append(parts.message)
        pending.extend(parts.calls)


@dataclass(frozen=True)
class _Parts:
    """What one model-facing item contributes, whatever surrounds it: its tool messages (by call id), whether
    it opens a message of its own (earlier calls still unanswered are answered first), that message (None:
    nothing this format carries) and the calls it makes."""

    results: list[tuple[str, dict[str, Any]]]
    opens: bool
    message: dict[str, Any] | None = None
    calls: list[str] = field(default_factory=list)


def _parts(item: Item) -> _Parts:
    results = [
        (b.call_id, {"role": "tool", "tool_call_id": b.call_id, "content": _result_text(b)})
        for b in item.blocks
        if isinstance(b, ToolResultBlock)
    ]
    rest = [b for b in item.blocks if not isinstance(b, ToolResultBlock)]
    if not rest or item.kind is ItemKind.TOOL:
        return _Parts(results, opens=False)  # a stray ErrorBlock without a call has nowhere to go here
    if item.kind in _SYSTEM_KINDS:
        return _Parts(results, True, {"role": "system", "content": blocks_text(rest)})
    if item.kind is ItemKind.ASSISTANT:
        message = _assistant_message(rest)
        if message["content"] is None and "tool_calls" not in message:
            return _Parts(results, True)  # reasoning only (cut by max_tokens): null content is refused
        return _Parts(results, True, message, [b.call_id for b in rest if isinstance(b, ToolUseBlock)])
    return _Parts(results, True, {"role": "user", "content": [_user_part(b) for b in rest]})


#: Each model-facing item converted once while it lives: a turn converts only the items new since the last.
_PARTS = model_facing_memo(_parts, OPENAI_CHAT)
#: Each conversation's messages so far: a turn adds only its new items to the last turn's.
_FOLD = PrefixFold(_Conversation, _add)


def _result_text(result: ToolResultBlock) -> str:
    text = blocks_text(result.content)
    return f"Error: {text}" if result.is_error and not text.startswith("Error") else text


def _assistant_message(blocks: Sequence[BaseBlock]) -> dict[str, Any]:
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    calls = [
        {
            "id": b.call_id,
            "type": "function",
            "function": {"name": b.tool_name, "arguments": json.dumps(b.arguments)},
        }
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user_part(block: BaseBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageBlock):
        inline = media_base64(block)
        url = f"data:{inline[1]};base64,{inline[0]}" if inline else block.url
        if url:
            return {"type": "image_url", "image_url": {"url": url}}
    if isinstance(block, AudioBlock) and (inline := media_base64(block)):
        return {
            "type": "input_audio",
            "input_audio": {"data": inline[0], "format": _AUDIO_FORMATS.get(inline[1], "wav")},
        }
    if isinstance(block, DocumentBlock):
        inline = media_base64(block)
        if inline:
            file: dict[str, str] = {"file_data": f"data:{inline[1]};base64,{inline[0]}"}
            if block.filename:
                file["filename"] = block.filename
            return {"type": "file", "file": file}
        if block.file_id:
            return {"type": "file", "file": {"file_id": block.file_id}}
    return {"type": "text", "text": blocks_text([block])}


def _chunk_events(chunk: Any) -> list[ModelEvent]:
    events: list[ModelEvent] = []
    for choice in chunk.choices[:1]:
        delta = choice.delta
        if delta is not None:
            # vLLM/DeepSeek-style servers stream reasoning in an extra field the SDK keeps untyped.
            extra = delta.model_extra or {}
            reasoning = extra.get("reasoning_content") or extra.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                events.append(ReasoningDeltaEvent(text=reasoning, provider=OPENAI_CHAT))
            if delta.content:
                events.append(TextDeltaEvent(delta.content))
            for tc in delta.tool_calls or ():
                fn = tc.function
                events.append(
                    ToolCallDeltaEvent(
                        index=tc.index,
                        call_id=tc.id,
                        name=fn.name if fn else None,
                        arguments=(fn.arguments or "") if fn else "",
                    )
                )
        if choice.finish_reason:
            events.append(FinishEvent(FinishReason.from_provider("openai", choice.finish_reason)))
            events.append(ResponseEvent(chunk.id or None, chunk.model or None))
    if chunk.usage is not None:
        events.append(UsageEvent(_usage(chunk.usage)))
    return events


def _usage(u: Any) -> Usage:
    prompt_details = getattr(u, "prompt_tokens_details", None)
    completion_details = getattr(u, "completion_tokens_details", None)
    metadata: dict[str, JsonValue] = {}
    return Usage(
        input_tokens=u.prompt_tokens or 0,
        cached_tokens=(getattr(prompt_details, "cached_tokens", None) or 0) if prompt_details else 0,
        output_tokens=u.completion_tokens or 0,
        reasoning_tokens=(getattr(completion_details, "reasoning_tokens", None) or 0)
        if completion_details
        else 0,
        metadata=metadata,
    )


def _map_error(exc: openai.APIError) -> ProviderError:
    import openai

    message = str(getattr(exc, "message", "") or exc)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if isinstance(exc, openai.RateLimitError):
            return RateLimitError(message, "openai", status, _retry_after(exc.response))
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return AuthenticationError(message, "openai", status)
        if status in (400, 413) and (
            "context_length_exceeded" in str(exc.code) or "context length" in message
        ):
            return ContextTooLongError(message, "openai", status)
        if status >= 500:
            return ProviderUnavailableError(message, "openai", status)
        return BadRequestError(message, "openai", status)
    return ProviderUnavailableError(message, "openai", 0)  # connection / timeout / garbage


def _retry_after(response: httpx2.Response) -> float | None:
    for header in ("retry-after-ms", "retry-after"):
        value = response.headers.get(header)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            continue
        return seconds / 1000 if header == "retry-after-ms" else seconds
    return None
