"""`GeminiModel`: Google Gemini over the official ``google-genai`` SDK
(``client.aio.models.generate_content_stream``), which owns the transport and the SSE parsing.

How turns become blocks and go back (thought signatures included) is `_geminiconv`'s docstring. Here: the
request (settings mapped, function declarations, the SDK's automatic function calling and retries off), the
stream as `ModelEvent`s, and the SDK's errors typed.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx2

from plexus.core import FinishReason, FinishReasonKind, JsonValue, UnknownBlock, Usage

from ._client import ModelRequest, ToolSpec
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
    BlockEvent,
    FinishEvent,
    ModelEvent,
    ReasoningDeltaEvent,
    ResponseEvent,
    TextDeltaEvent,
    ToolCallDeltaEvent,
    UsageEvent,
)
from ._geminiconv import GEMINI_CALL_ID_PREFIX, GEMINI_PART, gemini_contents
from ._openai import _retry_after
from ._provenance import GEMINI
from ._settings import ModelSettings, ProviderKwargs, SettingsCache, UnsupportedSettingError
from ._tokencount import CHARS_PER_TOKEN, tool_chars

if TYPE_CHECKING:
    from google import genai
    from google.genai import types
    from google.genai.models import AsyncModels

__all__ = ["GeminiModel", "gemini_request"]

_log = logging.getLogger(__name__)
_PROVIDER = "gemini"
_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
#: `ModelSettings.reasoning_effort` as Gemini's ``thinking_level`` ("none" turns thinking off: budget 0).
_LEVELS = {"minimal": "MINIMAL", "low": "LOW", "medium": "MEDIUM", "high": "HIGH", "xhigh": "XHIGH"}
#: The part fields `GeminiModel` turns into blocks of their own; any other part is kept whole.
_KNOWN = frozenset({"text", "thought", "thought_signature", "function_call"})


class GeminiModel:
    """A `ModelClient` over ``genai.Client(...).aio.models.generate_content_stream``.

    Pass the client you built (``genai.Client(api_key=..., http_options=types.HttpOptions(base_url=...))``,
    or Vertex AI's): keys, endpoint and timeouts are yours. Each call turns the SDK's retries and automatic
    function calling off: retries are Plexus's (`ProviderRetry`, the run's RetryPolicy) and tools run in the
    loop, journaled.
    """

    def __init__(self, client: genai.Client | genai.client.AsyncClient, model: str) -> None:
        from google import genai  # whoever built the client has imported it already

        aio = client.aio if isinstance(client, genai.Client) else client
        self._models: AsyncModels = aio.models
        self._model = model
        self._settings = SettingsCache(_settings_kwargs)

    @property
    def model(self) -> str:
        return self._model

    def check_settings(self, request: ModelRequest) -> None:
        """Refuse a setting of ``request`` Gemini cannot honour (`UnsupportedSettingError`), and map its
        settings now: `LLMAgent` calls this when built, so its turns find them mapped."""
        self._settings(request.settings, request.max_tokens, request.temperature)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        # Imported here, not at the top: a worker that never calls Gemini never imports its SDK.
        from google.genai import errors

        body = _request(self._model, request, self._settings)
        parser = _StreamParser()
        try:
            chunks = await self._models.generate_content_stream(**body)
            async for chunk in chunks:
                for event in parser.feed(chunk):
                    yield event
        except errors.APIError as exc:
            raise _map_error(exc) from exc
        except httpx2.HTTPError as exc:  # a connection cut mid-stream surfaces from httpx2, unwrapped
            raise ProviderUnavailableError(f"stream broken: {exc!r}", _PROVIDER, 0) from exc
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            # Garbage on the wire (bad JSON, parts of the wrong shape) must not surface as a bare exception.
            raise ProviderProtocolError(f"not a gemini stream: {exc!r}"[:500], _PROVIDER, 200) from exc
        if not parser.finished:
            # The SDK ends quietly when the server closes the body early: without a finish reason the turn
            # is a broken stream, not an answer.
            raise ProviderUnavailableError("stream ended without a finish reason", _PROVIDER, 0)

    async def count_tokens(self, request: ModelRequest) -> int:
        """``request``'s input tokens (`TokenCounter`): its contents (thought signatures with them) counted by
        ``models.count_tokens``; the system instruction and the function declarations, which the Gemini
        Developer API does not take there (the SDK refuses them), estimated at 4 characters a token."""
        from google.genai import errors, types

        system, contents = gemini_contents(request.items)
        config = types.CountTokensConfig(
            http_options=types.HttpOptions(retry_options=types.HttpRetryOptions(attempts=1))
        )
        try:
            counted = await self._models.count_tokens(model=self._model, contents=contents, config=config)
            total = int(counted.total_tokens)  # type: ignore[arg-type]  # None: garbage, typed below
        except errors.APIError as exc:
            raise _map_error(exc) from exc
        except httpx2.HTTPError as exc:
            raise ProviderUnavailableError(f"count broken: {exc!r}", _PROVIDER, 0) from exc
        except (ValueError, TypeError, AttributeError) as exc:
            raise ProviderProtocolError(f"not a token count: {exc!r}"[:500], _PROVIDER, 200) from exc
        chars = sum(len(p.text or "") for p in system.parts or ()) if system is not None else 0
        return total + (chars + tool_chars(request.tools)) // CHARS_PER_TOKEN


def gemini_request(model: str, request: ModelRequest) -> dict[str, Any]:
    """The keyword arguments of ``generate_content_stream`` for ``request`` (``model``, ``contents``,
    ``config``), deep copies the caller may change."""
    body = _request(model, request, SettingsCache(_settings_kwargs, size=1))
    return {
        "model": body["model"],
        "contents": [c.model_copy(deep=True) for c in body["contents"]],
        "config": body["config"].model_copy(deep=True),
    }


def _request(model: str, request: ModelRequest, settings: SettingsCache) -> dict[str, Any]:
    from google.genai import types

    always, with_tools = settings(request.settings, request.max_tokens, request.temperature)
    system, contents = gemini_contents(request.items)
    config: dict[str, Any] = dict(always)
    if system is not None:
        config["system_instruction"] = system
    if request.tools:
        config["tools"] = [gemini_tool(request.tools)]
        config.update(with_tools)
    if request.output is not None:
        config["response_mime_type"] = "application/json"
        config["response_json_schema"] = request.output.schema
    if request.extra:
        config.update(request.extra)
    return {"model": model, "contents": contents, "config": types.GenerateContentConfig(**config)}


def gemini_tool(tools: Sequence[ToolSpec]) -> types.Tool:
    """One ``Tool`` holding a function declaration per tool (the JSON Schema as ``parametersJsonSchema``)."""
    from google.genai import types

    return types.Tool(
        function_declarations=[
            types.FunctionDeclaration(
                name=t.name, description=t.description, parameters_json_schema=t.parameters
            )
            for t in tools
        ]
    )


def _refuse(setting: str, why: str) -> UnsupportedSettingError:
    return UnsupportedSettingError(f"{setting} {why}", setting, _PROVIDER)


def _settings_kwargs(settings: ModelSettings, max_tokens: int, temperature: float | None) -> ProviderKwargs:
    """`ModelSettings` as ``GenerateContentConfig`` fields."""
    from google.genai import types

    s = settings
    if s.service_tier is not None:
        raise _refuse("service_tier", "is not a setting of the gemini API")
    if s.reasoning_summary is not None:
        raise _refuse(
            "reasoning_summary", "is the Responses API's; gemini streams thought summaries on its own"
        )
    if s.parallel_tool_calls is False:
        raise _refuse("parallel_tool_calls", "cannot be turned off on gemini (it has no such setting)")
    if s.reasoning_effort is not None and s.thinking_budget is not None:
        raise _refuse("thinking_budget", "and reasoning_effort (thinking_level) cannot both be set on gemini")
    if s.reasoning_effort == "max":
        raise _refuse("reasoning_effort", "'max' is not a gemini thinking_level (minimal … xhigh)")
    always: dict[str, Any] = {
        "max_output_tokens": s.max_tokens if s.max_tokens is not None else max_tokens,
        # Tools run in the loop, journaled; the SDK's retries would stack under Plexus's.
        "automatic_function_calling": types.AutomaticFunctionCallingConfig(disable=True),
        "http_options": types.HttpOptions(
            retry_options=types.HttpRetryOptions(attempts=1), extra_body=dict(s.extra_body or {}) or None
        ),
    }
    temperature = s.temperature if s.temperature is not None else temperature
    if temperature is not None:
        always["temperature"] = temperature
    if s.top_p is not None:
        always["top_p"] = s.top_p
    if s.seed is not None:
        always["seed"] = s.seed
    if s.stop is not None:
        always["stop_sequences"] = list(s.stop)
    if s.thinking_budget is not None:
        always["thinking_config"] = types.ThinkingConfig(
            thinking_budget=s.thinking_budget, include_thoughts=True
        )
    elif s.reasoning_effort == "none":
        always["thinking_config"] = types.ThinkingConfig(thinking_budget=0)
    elif s.reasoning_effort is not None:
        level = types.ThinkingLevel(_LEVELS[s.reasoning_effort])
        always["thinking_config"] = types.ThinkingConfig(thinking_level=level, include_thoughts=True)
    with_tools: dict[str, Any] = {}
    if s.tool_choice is not None:
        mode = _MODES.get(s.tool_choice)
        calling = (
            types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode(mode))
            if mode is not None
            else types.FunctionCallingConfig(
                mode=types.FunctionCallingConfigMode.ANY, allowed_function_names=[s.tool_choice]
            )
        )
        with_tools["tool_config"] = types.ToolConfig(function_calling_config=calling)
    return always, with_tools


class _StreamParser:
    """The SDK's ``GenerateContentResponse`` chunks as `ModelEvent`s.

    Streamed text (and thought) chunks extend one block until another kind of part, or a signature, comes
    between; a signature becomes its own signature block right after its part (see `_geminiconv`). Gemini
    says ``STOP`` after function calls too: a turn with calls finishes ``tool_call``.
    """

    def __init__(self) -> None:
        self.finished = False
        self._next = 0
        #: the kind of the last block ("text", "thought", other) and its index, which same-kind chunks extend
        self._last: tuple[str, int] = ("", -1)
        self._calls = False

    def _index(self, kind: str) -> int:
        """The block index for a part of ``kind``: the last block's when it is of that kind and may grow."""
        if self._last[0] == kind:
            return self._last[1]
        return self._fresh(kind)

    def _fresh(self, kind: str) -> int:
        """A new block; ``kind`` "" when no later part may extend it."""
        self._next += 1
        self._last = (kind, self._next)
        return self._next

    def feed(self, chunk: Any) -> list[ModelEvent]:
        events: list[ModelEvent] = []
        candidates = chunk.candidates or []
        for candidate in candidates[:1]:
            content = candidate.content
            for part in (content.parts if content is not None else None) or ():
                self._part(part, events)
            if candidate.finish_reason is not None:
                events.append(FinishEvent(self._finish(candidate.finish_reason)))
                events.append(ResponseEvent(chunk.response_id or None, chunk.model_version or None))
        feedback = chunk.prompt_feedback
        if not candidates and feedback is not None and feedback.block_reason is not None:
            # The prompt itself was blocked: no candidate at all.
            events.append(FinishEvent(FinishReason.blocked(_raw(feedback.block_reason))))
            self.finished = True
        if chunk.usage_metadata is not None:
            events.append(UsageEvent(_usage(chunk.usage_metadata)))
        return events

    def _part(self, part: Any, events: list[ModelEvent]) -> None:
        fields = {name for name in type(part).model_fields if getattr(part, name) is not None}
        if not fields <= _KNOWN or not fields:
            # A part Plexus has no block for (or one whose fields the SDK did not know): kept whole, its
            # signature inside it, and sent back as it came.
            dumped = part.model_dump(mode="json", by_alias=True, exclude_none=True)
            raw: dict[str, JsonValue] = {"type": GEMINI_PART, "part": dumped}
            events.append(BlockEvent(UnknownBlock(type=GEMINI_PART, raw=raw), index=self._fresh("")))
            return
        if part.function_call is not None:
            call = part.function_call
            self._calls = True
            call_id = call.id or f"{GEMINI_CALL_ID_PREFIX}{uuid.uuid4().hex[:24]}"
            # Through the accumulator's checks: arguments that are not a finite JSON object become an
            # error result the model sees.
            arguments = json.dumps(call.args) if call.args is not None else ""
            name = call.name or ""
            events.append(
                ToolCallDeltaEvent(self._fresh(""), call_id=call_id, name=name, arguments=arguments)
            )
        elif part.text:
            if part.thought:
                events.append(
                    ReasoningDeltaEvent(text=part.text, index=self._index("thought"), provider=GEMINI)
                )
            else:
                events.append(TextDeltaEvent(part.text, self._index("text")))
        if part.thought_signature is not None:
            signature = base64.b64encode(part.thought_signature).decode("ascii")
            # Its own block right after its part; a signature ends its part, so what follows is a new block.
            events.append(
                ReasoningDeltaEvent(
                    signature=signature, redacted=True, index=self._fresh(""), provider=GEMINI
                )
            )

    def _finish(self, reason: Any) -> FinishReason:
        self.finished = True
        raw = _raw(reason)
        if raw == "FINISH_REASON_UNSPECIFIED":
            return FinishReason.other(raw)
        finish = FinishReason.from_provider(_PROVIDER, raw)
        if self._calls and finish.kind is FinishReasonKind.COMPLETED:
            return FinishReason.tool_call(raw)
        return finish


def _raw(value: Any) -> str:
    return str(getattr(value, "value", value))


def _usage(u: Any) -> Usage:
    prompt = u.prompt_token_count or 0
    cached = u.cached_content_token_count or 0
    thoughts = u.thoughts_token_count or 0
    # Gemini counts thoughts outside the candidates; Plexus's output includes reasoning.
    return Usage(
        input_tokens=max(prompt, cached),
        cached_tokens=cached,
        output_tokens=(u.candidates_token_count or 0) + thoughts,
        reasoning_tokens=thoughts,
    )


def _map_error(exc: Any) -> ProviderError:
    message = str(exc.message or exc)[:2000]
    code = int(exc.code or 0)
    status = str(exc.status or "")
    response = getattr(exc, "response", None)
    if code == 429 or status == "RESOURCE_EXHAUSTED":
        retry_after = _retry_after(response) if isinstance(response, httpx2.Response) else None
        return RateLimitError(message, _PROVIDER, code or 429, retry_after)
    if code in (401, 403) or status in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return AuthenticationError(message, _PROVIDER, code)
    if code >= 500 or code == 0:
        return ProviderUnavailableError(message, _PROVIDER, code)
    if code == 400 and "token count" in message and "exceed" in message:
        return ContextTooLongError(message, _PROVIDER, code)
    return BadRequestError(message, _PROVIDER, code)
