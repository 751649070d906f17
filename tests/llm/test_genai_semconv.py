"""The GenAI names plexus.llm takes from opentelemetry-semantic-conventions are the published ones, and the
content opt-in reads the conventions' environment variable (issue 41, item 4)."""

from __future__ import annotations

import pytest

from plexus.llm import (
    CAPTURE_CONTENT_ENV,
    AnthropicModel,
    GeminiModel,
    GenAITelemetry,
    LLMAgent,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ScriptedModel,
)
from plexus.llm import _semconv as sc
from plexus.llm._genai import capture_from_env, provider_name

# The conventions' names (semantic-conventions-genai: gen-ai-spans.md, gen-ai-agent-spans.md,
# gen-ai-metrics.md), spelled out here on purpose: a package upgrade that renames one fails this test.
PUBLISHED = {
    "OPERATION_NAME": "gen_ai.operation.name",
    "PROVIDER_NAME": "gen_ai.provider.name",
    "AGENT_NAME": "gen_ai.agent.name",
    "AGENT_ID": "gen_ai.agent.id",
    "REQUEST_MODEL": "gen_ai.request.model",
    "REQUEST_MAX_TOKENS": "gen_ai.request.max_tokens",
    "REQUEST_TEMPERATURE": "gen_ai.request.temperature",
    "REQUEST_TOP_P": "gen_ai.request.top_p",
    "REQUEST_SEED": "gen_ai.request.seed",
    "REQUEST_STOP_SEQUENCES": "gen_ai.request.stop_sequences",
    "RESPONSE_ID": "gen_ai.response.id",
    "RESPONSE_MODEL": "gen_ai.response.model",
    "RESPONSE_FINISH_REASONS": "gen_ai.response.finish_reasons",
    "USAGE_INPUT_TOKENS": "gen_ai.usage.input_tokens",
    "USAGE_OUTPUT_TOKENS": "gen_ai.usage.output_tokens",
    "USAGE_CACHE_READ_INPUT_TOKENS": "gen_ai.usage.cache_read.input_tokens",
    "USAGE_CACHE_CREATION_INPUT_TOKENS": "gen_ai.usage.cache_creation.input_tokens",
    "USAGE_REASONING_OUTPUT_TOKENS": "gen_ai.usage.reasoning.output_tokens",
    "TOOL_NAME": "gen_ai.tool.name",
    "TOOL_CALL_ID": "gen_ai.tool.call.id",
    "TOOL_TYPE": "gen_ai.tool.type",
    "TOKEN_TYPE": "gen_ai.token.type",
    "INPUT_MESSAGES": "gen_ai.input.messages",
    "OUTPUT_MESSAGES": "gen_ai.output.messages",
    "SYSTEM_INSTRUCTIONS": "gen_ai.system_instructions",
    "TOOL_CALL_ARGUMENTS": "gen_ai.tool.call.arguments",
    "TOOL_CALL_RESULT": "gen_ai.tool.call.result",
    "ERROR_TYPE": "error.type",
    "CHAT": "chat",
    "INVOKE_AGENT": "invoke_agent",
    "EXECUTE_TOOL": "execute_tool",
    "PROVIDER_OPENAI": "openai",
    "PROVIDER_ANTHROPIC": "anthropic",
    "PROVIDER_GCP_GEMINI": "gcp.gemini",
    "TOKEN_INPUT": "input",
    "TOKEN_OUTPUT": "output",
    "CLIENT_TOKEN_USAGE": "gen_ai.client.token.usage",
    "CLIENT_OPERATION_DURATION": "gen_ai.client.operation.duration",
}


def test_the_names_are_the_published_ones() -> None:
    assert {name: getattr(sc, name) for name in PUBLISHED} == PUBLISHED


@pytest.mark.parametrize(
    ("value", "captured"),
    [
        (None, False),
        ("", False),
        ("false", False),
        ("NO_CONTENT", False),
        ("EVENT_ONLY", False),  # Plexus emits no GenAI events
        ("true", True),
        ("True", True),
        ("SPAN_ONLY", True),
        ("span_and_event", True),
    ],
)
def test_content_is_captured_only_when_the_environment_opts_in(value: str | None, captured: bool) -> None:
    env = {} if value is None else {CAPTURE_CONTENT_ENV: value}
    assert CAPTURE_CONTENT_ENV == "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    assert capture_from_env(env) is captured


def test_the_provider_name_of_each_adapter() -> None:
    def bare(cls: type[object]) -> object:
        return object.__new__(cls)  # the name depends on the class only

    assert [provider_name(bare(c)) for c in (OpenAIChatModel, OpenAIResponsesModel, AnthropicModel)] == [
        "openai",
        "openai",
        "anthropic",
    ]
    assert provider_name(bare(GeminiModel)) == "gcp.gemini"
    assert provider_name(ScriptedModel([])) == "_OTHER"

    class Custom(ScriptedModel):
        genai_provider = "mistral_ai"

    assert provider_name(Custom([])) == "mistral_ai"


def test_an_agent_has_telemetry_by_default_once_and_none_on_request() -> None:
    model = ScriptedModel([])
    default = LLMAgent(model)
    assert sum(isinstance(m, GenAITelemetry) for m in default._model_middleware) == 1
    assert sum(isinstance(m, GenAITelemetry) for m in default._tool_middleware) == 1
    own = GenAITelemetry(capture_content=True)
    mine = LLMAgent(model, middleware=[own])
    assert [m for m in mine._model_middleware if isinstance(m, GenAITelemetry)] == [own]
    off = LLMAgent(model, telemetry=None)
    assert not any(isinstance(m, GenAITelemetry) for m in [*off._model_middleware, *off._tool_middleware])
