"""`GenAITelemetry`: the loop's model calls, tool executions and agent invocations as OpenTelemetry GenAI
spans and metrics, which LLM observability tools (Langfuse, Phoenix, Logfire, Grafana...) read.

A middleware at three stages: ``invoke_agent {type}`` around one handled message (INTERNAL), ``chat {model}``
around one model call (CLIENT; inside the retries, so each attempt is a span) and ``execute_tool {name}``
around one tool call (INTERNAL). Spans are made only while the handler's own span records (a tracer provider
is installed and the trace sampled); otherwise each stage is one check and a call. The metrics
``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration`` are recorded when a meter provider
is installed (`plexus.runtime.kernel.metrics_enabled`). Message content (prompts, answers, tool arguments and
results) goes on the spans only when opted in: ``capture_content=True``, or, left None, the conventions'
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (`capture_from_env`). Names: `_semconv.py`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from plexus.core import (
    BaseBlock,
    DataBlock,
    ErrorBlock,
    Item,
    ItemKind,
    JsonValue,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from plexus.runtime.kernel import metrics_enabled

from . import _semconv as sc
from ._accumulate import ModelTurn
from ._middleware import MessageCall, Middleware, ModelCall, ToolCall

__all__ = ["CAPTURE_CONTENT_ENV", "GenAITelemetry", "capture_from_env", "provider_name"]

#: The conventions' opt-in for message content on spans and events.
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# `true` (the older instrumentations' value) and the util-genai modes that put content on spans; Plexus
# emits no GenAI events, so EVENT_ONLY captures nothing here.
_CAPTURE_VALUES = frozenset({"true", "1", "span_only", "span_and_event"})

_tracer = trace.get_tracer("plexus.llm")
_meter = metrics.get_meter("plexus.llm")
_token_usage = sc.create_token_usage(_meter)
_duration = sc.create_operation_duration(_meter)

_SYSTEM_KINDS = frozenset({ItemKind.SYSTEM, ItemKind.DEVELOPER})


def capture_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` opts in to content on spans: ``true``,
    ``SPAN_ONLY`` or ``SPAN_AND_EVENT`` (any case); unset or anything else, no content."""
    value = (os.environ if env is None else env).get(CAPTURE_CONTENT_ENV, "")
    return value.strip().lower() in _CAPTURE_VALUES


def provider_name(client: object) -> str:
    """``gen_ai.provider.name`` of a model client: its ``genai_provider`` attribute, else by adapter."""
    own = getattr(client, "genai_provider", None)
    if isinstance(own, str):
        return own
    # By class name: importing the adapters here would import every adapter module with this one.
    return _PROVIDERS.get(type(client).__name__, "_OTHER")


_PROVIDERS = {
    "OpenAIChatModel": sc.PROVIDER_OPENAI,
    "OpenAIResponsesModel": sc.PROVIDER_OPENAI,
    "AnthropicModel": sc.PROVIDER_ANTHROPIC,
    "GeminiModel": sc.PROVIDER_GCP_GEMINI,
}


def _recording() -> bool:
    # The worker's handler span (TracingInterceptor) is current: it records only with an SDK tracer
    # provider installed and the trace sampled. No provider: the invalid span, False (≈ 0.2 µs).
    return trace.get_current_span().is_recording()


@dataclass(frozen=True)
class GenAITelemetry(Middleware):
    """GenAI spans and metrics for an `LLMAgent` (on by default: ``LLMAgent(telemetry=...)``).

    ``capture_content``: put prompts, answers and tool arguments/results on the spans; None reads
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` at each span (`capture_from_env`).
    """

    capture_content: bool | None = None

    def _capture(self) -> bool:
        return capture_from_env() if self.capture_content is None else self.capture_content

    async def process_message(
        self, context: MessageCall, call_next: Callable[[MessageCall], Awaitable[list[BaseBlock] | None]]
    ) -> list[BaseBlock] | None:
        if not _recording():
            return await call_next(context)
        agent_id = context.ctx.agent_id
        model = getattr(context.agent, "model", None)
        attributes: dict[str, Any] = {
            sc.OPERATION_NAME: sc.INVOKE_AGENT,
            sc.AGENT_NAME: agent_id.type,
            sc.AGENT_ID: str(agent_id),
            sc.PROVIDER_NAME: provider_name(model),
        }
        if model is not None:
            attributes[sc.REQUEST_MODEL] = model.model
        with _tracer.start_as_current_span(
            f"{sc.INVOKE_AGENT} {agent_id.type}", kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            try:
                return await call_next(context)
            except BaseException as exc:
                span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
                raise

    async def process_model(
        self, context: ModelCall, call_next: Callable[[ModelCall], Awaitable[ModelTurn]]
    ) -> ModelTurn:
        tracing = _recording()
        measuring = metrics_enabled()
        if not tracing and not measuring:
            return await call_next(context)
        request = context.request
        provider = provider_name(context.client)
        common: dict[str, Any] = {
            sc.OPERATION_NAME: sc.CHAT,
            sc.PROVIDER_NAME: provider,
            sc.REQUEST_MODEL: context.model,
        }
        started = time.monotonic()
        turn: ModelTurn | None = None
        error: str | None = None
        span: Span | None = None
        try:
            if not tracing:
                turn = await call_next(context)
                return turn
            with _tracer.start_as_current_span(
                f"{sc.CHAT} {context.model}", kind=SpanKind.CLIENT, attributes=common
            ) as span:
                span.set_attributes(_request_attributes(context))
                capture = self._capture()
                if capture:
                    system, messages = _input_messages(request.items)
                    if system:
                        span.set_attribute(sc.SYSTEM_INSTRUCTIONS, _dumps(system))
                    span.set_attribute(sc.INPUT_MESSAGES, _dumps(messages))
                turn = await call_next(context)
                span.set_attributes(_response_attributes(turn))
                if capture:
                    span.set_attribute(sc.OUTPUT_MESSAGES, _dumps([_output_message(turn)]))
                return turn
        except BaseException as exc:
            error = type(exc).__qualname__
            if span is not None:
                span.set_attribute(sc.ERROR_TYPE, error)
            raise
        finally:
            if measuring:
                _record_metrics(common, turn, error, time.monotonic() - started)

    async def process_tool(
        self, context: ToolCall, call_next: Callable[[ToolCall], Awaitable[ToolResultBlock]]
    ) -> ToolResultBlock:
        if not _recording():
            return await call_next(context)
        call = context.call
        name = call.tool_name or "?"
        attributes: dict[str, Any] = {
            sc.OPERATION_NAME: sc.EXECUTE_TOOL,
            sc.TOOL_NAME: name,
            sc.TOOL_CALL_ID: call.call_id,
            sc.TOOL_TYPE: "function",
        }
        with _tracer.start_as_current_span(
            f"{sc.EXECUTE_TOOL} {name}", kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            capture = self._capture()
            if capture:
                span.set_attribute(sc.TOOL_CALL_ARGUMENTS, _dumps(call.arguments))
            try:
                result = await call_next(context)
            except BaseException as exc:
                span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
                raise
            error = next((b for b in result.content if isinstance(b, ErrorBlock)), None)
            if error is not None:
                # The model sees the error and the loop goes on; the span still shows the tool failed.
                span.set_attribute(sc.ERROR_TYPE, error.error_type)
                span.set_status(Status(StatusCode.ERROR, error.message))
            if capture:
                span.set_attribute(sc.TOOL_CALL_RESULT, _dumps(_parts(result.content)))
            return result


def _request_attributes(context: ModelCall) -> dict[str, Any]:
    """The request settings the call was made with (its settings' set values win, as in the adapters)."""
    request = context.request
    s = request.settings
    out: dict[str, Any] = {
        sc.REQUEST_MAX_TOKENS: s.max_tokens if s.max_tokens is not None else request.max_tokens
    }
    temperature = s.temperature if s.temperature is not None else request.temperature
    if temperature is not None:
        out[sc.REQUEST_TEMPERATURE] = temperature
    if s.top_p is not None:
        out[sc.REQUEST_TOP_P] = s.top_p
    if s.seed is not None:
        out[sc.REQUEST_SEED] = s.seed
    if s.stop is not None:
        out[sc.REQUEST_STOP_SEQUENCES] = list(s.stop)
    return out


def _response_attributes(turn: ModelTurn) -> dict[str, Any]:
    u = turn.usage
    out: dict[str, Any] = {
        sc.RESPONSE_FINISH_REASONS: [_finish(turn)],
        sc.USAGE_INPUT_TOKENS: u.input_tokens,
        sc.USAGE_OUTPUT_TOKENS: u.output_tokens,
    }
    if u.cached_tokens:
        out[sc.USAGE_CACHE_READ_INPUT_TOKENS] = u.cached_tokens
    if u.cache_write_tokens:
        out[sc.USAGE_CACHE_CREATION_INPUT_TOKENS] = u.cache_write_tokens
    if u.reasoning_tokens:
        out[sc.USAGE_REASONING_OUTPUT_TOKENS] = u.reasoning_tokens
    if turn.response_id is not None:
        out[sc.RESPONSE_ID] = turn.response_id
    if turn.response_model is not None:
        out[sc.RESPONSE_MODEL] = turn.response_model
    return out


def _finish(turn: ModelTurn) -> str:
    """The provider's own finish reason (``stop``, ``end_turn``...), as the conventions ask; else Plexus's."""
    return turn.finish_reason.raw or turn.finish_reason.kind.value


def _record_metrics(
    common: dict[str, Any], turn: ModelTurn | None, error: str | None, seconds: float
) -> None:
    attributes = dict(common)
    if turn is not None and turn.response_model is not None:
        attributes[sc.RESPONSE_MODEL] = turn.response_model
    if error is not None:
        attributes[sc.ERROR_TYPE] = error
    _duration.record(seconds, attributes)
    if turn is not None:
        _token_usage.record(turn.usage.input_tokens, {**attributes, sc.TOKEN_TYPE: sc.TOKEN_INPUT})
        _token_usage.record(turn.usage.output_tokens, {**attributes, sc.TOKEN_TYPE: sc.TOKEN_OUTPUT})


# -- content (opt-in): the conventions' message JSON --------------------------------------------------


def _input_messages(items: Sequence[Item]) -> tuple[list[JsonValue], list[JsonValue]]:
    """(system instructions' parts, the other items as ``{"role", "parts"}`` messages)."""
    system: list[JsonValue] = []
    messages: list[JsonValue] = []
    for item in items:
        if item.kind in _SYSTEM_KINDS:
            system.extend(_parts(item.blocks))
            continue
        role = item.kind.value if item.kind in (ItemKind.ASSISTANT, ItemKind.TOOL) else "user"
        messages.append({"role": role, "parts": _parts(item.blocks)})
    return system, messages


def _output_message(turn: ModelTurn) -> JsonValue:
    return {"role": "assistant", "parts": _parts(turn.item.blocks), "finish_reason": _finish(turn)}


def _parts(blocks: Sequence[BaseBlock]) -> list[JsonValue]:
    parts: list[JsonValue] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "content": b.text})
        elif isinstance(b, ThinkingBlock):
            if b.content:
                parts.append({"type": "reasoning", "content": b.content})
        elif isinstance(b, ToolUseBlock):
            parts.append(
                {"type": "tool_call", "id": b.call_id, "name": b.tool_name, "arguments": b.arguments}
            )
        elif isinstance(b, ToolResultBlock):
            parts.append({"type": "tool_call_response", "id": b.call_id, "response": _parts(b.content)})
        elif isinstance(b, ErrorBlock):
            parts.append({"type": "text", "content": f"{b.error_type}: {b.message}"})
        elif isinstance(b, DataBlock):
            parts.append({"type": "text", "content": _dumps(b.data)})
        else:
            parts.append({"type": b.type})  # media and unknown blocks: their kind, not their bytes
    return parts


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
