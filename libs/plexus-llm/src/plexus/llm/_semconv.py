"""The OpenTelemetry GenAI semantic-convention names Plexus uses, in one place.

They come from ``opentelemetry-semantic-conventions`` (its ``_incubating`` GenAI modules): since 0.66 each is
marked "moved to the semantic-conventions-genai repository", which publishes no Python package yet, so this
module is the one place that imports them; ``tests/llm/test_genai_semconv.py`` pins them to the published
names. Nothing else in plexus.llm spells a ``gen_ai.*`` name.
"""

from __future__ import annotations

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as _gm
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE

__all__ = [
    "AGENT_ID",
    "AGENT_NAME",
    "CHAT",
    "CLIENT_OPERATION_DURATION",
    "CLIENT_TOKEN_USAGE",
    "CONVERSATION_ID",
    "ERROR_TYPE",
    "EXECUTE_TOOL",
    "INPUT_MESSAGES",
    "INVOKE_AGENT",
    "OPERATION_NAME",
    "OUTPUT_MESSAGES",
    "PROVIDER_ANTHROPIC",
    "PROVIDER_GCP_GEMINI",
    "PROVIDER_GCP_VERTEX_AI",
    "PROVIDER_NAME",
    "PROVIDER_OPENAI",
    "REQUEST_MAX_TOKENS",
    "REQUEST_MODEL",
    "REQUEST_SEED",
    "REQUEST_STOP_SEQUENCES",
    "REQUEST_TEMPERATURE",
    "REQUEST_TOP_P",
    "RESPONSE_FINISH_REASONS",
    "RESPONSE_ID",
    "RESPONSE_MODEL",
    "SYSTEM_INSTRUCTIONS",
    "TOKEN_INPUT",
    "TOKEN_OUTPUT",
    "TOKEN_TYPE",
    "TOOL_CALL_ARGUMENTS",
    "TOOL_CALL_ID",
    "TOOL_CALL_RESULT",
    "TOOL_NAME",
    "TOOL_TYPE",
    "USAGE_CACHE_CREATION_INPUT_TOKENS",
    "USAGE_CACHE_READ_INPUT_TOKENS",
    "USAGE_INPUT_TOKENS",
    "USAGE_OUTPUT_TOKENS",
    "USAGE_REASONING_OUTPUT_TOKENS",
    "create_operation_duration",
    "create_token_usage",
]

# Attributes.
OPERATION_NAME = _ga.GEN_AI_OPERATION_NAME
PROVIDER_NAME = _ga.GEN_AI_PROVIDER_NAME
AGENT_NAME = _ga.GEN_AI_AGENT_NAME
AGENT_ID = _ga.GEN_AI_AGENT_ID
CONVERSATION_ID = _ga.GEN_AI_CONVERSATION_ID
REQUEST_MODEL = _ga.GEN_AI_REQUEST_MODEL
REQUEST_MAX_TOKENS = _ga.GEN_AI_REQUEST_MAX_TOKENS
REQUEST_TEMPERATURE = _ga.GEN_AI_REQUEST_TEMPERATURE
REQUEST_TOP_P = _ga.GEN_AI_REQUEST_TOP_P
REQUEST_SEED = _ga.GEN_AI_REQUEST_SEED
REQUEST_STOP_SEQUENCES = _ga.GEN_AI_REQUEST_STOP_SEQUENCES
RESPONSE_ID = _ga.GEN_AI_RESPONSE_ID
RESPONSE_MODEL = _ga.GEN_AI_RESPONSE_MODEL
RESPONSE_FINISH_REASONS = _ga.GEN_AI_RESPONSE_FINISH_REASONS
USAGE_INPUT_TOKENS = _ga.GEN_AI_USAGE_INPUT_TOKENS
USAGE_OUTPUT_TOKENS = _ga.GEN_AI_USAGE_OUTPUT_TOKENS
USAGE_CACHE_READ_INPUT_TOKENS = _ga.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS
USAGE_CACHE_CREATION_INPUT_TOKENS = _ga.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
USAGE_REASONING_OUTPUT_TOKENS = _ga.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS
TOOL_NAME = _ga.GEN_AI_TOOL_NAME
TOOL_CALL_ID = _ga.GEN_AI_TOOL_CALL_ID
TOOL_TYPE = _ga.GEN_AI_TOOL_TYPE
TOKEN_TYPE = _ga.GEN_AI_TOKEN_TYPE
# Content: opt-in only (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT).
INPUT_MESSAGES = _ga.GEN_AI_INPUT_MESSAGES
OUTPUT_MESSAGES = _ga.GEN_AI_OUTPUT_MESSAGES
SYSTEM_INSTRUCTIONS = _ga.GEN_AI_SYSTEM_INSTRUCTIONS
TOOL_CALL_ARGUMENTS = _ga.GEN_AI_TOOL_CALL_ARGUMENTS
TOOL_CALL_RESULT = _ga.GEN_AI_TOOL_CALL_RESULT

# Values.
CHAT = _ga.GenAiOperationNameValues.CHAT.value
INVOKE_AGENT = _ga.GenAiOperationNameValues.INVOKE_AGENT.value
EXECUTE_TOOL = _ga.GenAiOperationNameValues.EXECUTE_TOOL.value
PROVIDER_OPENAI = _ga.GenAiProviderNameValues.OPENAI.value
PROVIDER_ANTHROPIC = _ga.GenAiProviderNameValues.ANTHROPIC.value
PROVIDER_GCP_GEMINI = _ga.GenAiProviderNameValues.GCP_GEMINI.value
PROVIDER_GCP_VERTEX_AI = _ga.GenAiProviderNameValues.GCP_VERTEX_AI.value
TOKEN_INPUT = _ga.GenAiTokenTypeValues.INPUT.value
TOKEN_OUTPUT = _ga.GenAiTokenTypeValues.OUTPUT.value

# Metrics: the instruments with the conventions' names, units and descriptions.
CLIENT_TOKEN_USAGE = _gm.GEN_AI_CLIENT_TOKEN_USAGE
CLIENT_OPERATION_DURATION = _gm.GEN_AI_CLIENT_OPERATION_DURATION
create_token_usage = _gm.create_gen_ai_client_token_usage
create_operation_duration = _gm.create_gen_ai_client_operation_duration
