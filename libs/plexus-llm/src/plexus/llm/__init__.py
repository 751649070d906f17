"""Plexus LLM loop: streaming model clients over the official SDKs and the durable agent loop.

Public API (the ``_modules`` are private):

- the model boundary: `ModelClient`, `ModelRequest` (its `ModelSettings`: `UnsupportedSettingError` for one a
  provider cannot honour), `ToolSpec`, `complete`, the stream events, and
  `TurnAccumulator` / `ModelTurn` (tool calls accumulated by index)
- typed provider errors: `ProviderError` and its subclasses
- adapters over the official SDKs: `OpenAIChatModel` (any OpenAI-compatible ``base_url``),
  `OpenAIResponsesModel` (OpenAI's Responses API, reasoning items round-tripped), `AnthropicModel`
  (Messages API), `GeminiModel` (google-genai, thought signatures round-tripped)
- the loop: `LLMAgent` (journaled steps `LlmStep`), tools (`tool`, `Tool`, `ToolRegistry`)
- compaction: `CompactionPipeline` and its strategies (tool pairs never split)
- middleware at the turn, model-call and tool-call stages: `Middleware`, `ProviderRetry`, `RateLimit`,
  `ToolOutputLimit`
- handoffs between agents: ``LLMAgent(handoffs=...)``, `Handoff`, `without_tool_calls`
- durable approvals: ``@tool(needs_approval=True)``, `approve` / `deny`, `ApprovalRequired`
- typed outputs: ``LLMAgent(output_type=...)``, `OutputSpec`, `OutputValidationError`
- MCP servers as tool sources: `MCPServer` (stdio or streamable HTTP; `ToolSource`), its typed errors
  `MCPServerError` / `MCPProtocolError` / `MCPTimeoutError` / `MCPToolError`, `close_mcp_connections`
- remote A2A agents as tools and handoff targets: `A2AAgent` (`A2ATool`; the journaled task id
  `A2ATaskAccepted`), its typed errors `A2AAgentError` / `A2AProtocolError` / `A2ATimeoutError` /
  `A2ATaskFailedError` / `A2AInputRequiredError`
- a deterministic model for tests and demos: `ScriptedModel`, `ScriptedTurn`
"""

from __future__ import annotations

from ._a2a import A2AAgent, A2ATool
from ._a2aerrors import (
    A2AAgentError,
    A2AInputRequiredError,
    A2AProtocolError,
    A2ATaskFailedError,
    A2ATimeoutError,
)
from ._a2atask import A2ATaskAccepted
from ._accumulate import INVALID_ARGUMENTS_KEY, ModelTurn, TurnAccumulator
from ._agent import FINISH_KEY, TRANSCRIPT_KEY, LLMAgent, ModelFinishedWithError
from ._anthropic import AnthropicModel, anthropic_messages, anthropic_request
from ._approvals import (
    APPROVAL_KEY,
    PENDING_KEY,
    ApprovalPendingError,
    ApprovalRequired,
    NoPendingApprovalError,
    approval_blocks,
    approve,
    deny,
)
from ._client import ModelClient, ModelRequest, ToolSpec, complete
from ._compaction import (
    CompactionPipeline,
    CompactionStrategy,
    DropFailedToolResults,
    DropReasoning,
    KeepRecent,
    SummarizeOlder,
    safe_cuts,
)
from ._errors import (
    AuthenticationError,
    BadRequestError,
    ContextTooLongError,
    OutputValidationError,
    ProviderError,
    ProviderProtocolError,
    ProviderUnavailableError,
    RateLimitError,
    TranscriptTooLargeError,
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
from ._gemini import GeminiModel, gemini_request
from ._genai import CAPTURE_CONTENT_ENV, GenAITelemetry
from ._handoff import HANDOFF_KEY, Handoff, HandoffInputError, without_tool_calls
from ._journal import JOURNAL_SEQ_KEY, LlmStep
from ._mcp import MCPServer, MCPTool, close_mcp_connections
from ._mcperrors import MCPProtocolError, MCPServerError, MCPTimeoutError, MCPToolError
from ._memo import ItemMemo
from ._middleware import (
    MessageCall,
    Middleware,
    ModelCall,
    ProviderRetry,
    RateLimit,
    ToolCall,
    ToolOutputLimit,
    Turn,
)
from ._openai import OpenAIChatModel, openai_messages, openai_request
from ._output import OUTPUT_TOOL, OutputSpec, strict_schema
from ._replay import JournalReplay, ReplayModel  # importing it registers the journal's replay hook
from ._responses import RESPONSES_ITEM, OpenAIResponsesModel, responses_input, responses_request
from ._scripted import ScriptedModel, ScriptedTurn, ScriptExhaustedError
from ._settings import ModelSettings, UnsupportedSettingError
from ._tokencount import TokenCounter, estimate_tokens
from ._tools import Tool, ToolArgumentsError, ToolRegistry, tool, tool_output_blocks
from ._toolsource import ToolSource

__all__ = [
    "APPROVAL_KEY",
    "CAPTURE_CONTENT_ENV",
    "FINISH_KEY",
    "HANDOFF_KEY",
    "INVALID_ARGUMENTS_KEY",
    "JOURNAL_SEQ_KEY",
    "OUTPUT_TOOL",
    "PENDING_KEY",
    "RESPONSES_ITEM",
    "TRANSCRIPT_KEY",
    "A2AAgent",
    "A2AAgentError",
    "A2AInputRequiredError",
    "A2AProtocolError",
    "A2ATaskAccepted",
    "A2ATaskFailedError",
    "A2ATimeoutError",
    "A2ATool",
    "AnthropicModel",
    "ApprovalPendingError",
    "ApprovalRequired",
    "AuthenticationError",
    "BadRequestError",
    "BlockEvent",
    "CompactionPipeline",
    "CompactionStrategy",
    "ContextTooLongError",
    "DropFailedToolResults",
    "DropReasoning",
    "FinishEvent",
    "GeminiModel",
    "GenAITelemetry",
    "Handoff",
    "HandoffInputError",
    "ItemMemo",
    "JournalReplay",
    "KeepRecent",
    "LLMAgent",
    "LlmStep",
    "MCPProtocolError",
    "MCPServer",
    "MCPServerError",
    "MCPTimeoutError",
    "MCPTool",
    "MCPToolError",
    "MessageCall",
    "Middleware",
    "ModelCall",
    "ModelClient",
    "ModelEvent",
    "ModelFinishedWithError",
    "ModelRequest",
    "ModelSettings",
    "ModelTurn",
    "NoPendingApprovalError",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "OutputSpec",
    "OutputValidationError",
    "PrefixFold",
    "ProviderError",
    "ProviderProtocolError",
    "ProviderRetry",
    "ProviderUnavailableError",
    "RateLimit",
    "RateLimitError",
    "ReasoningDeltaEvent",
    "ReplayModel",
    "ResponseEvent",
    "ScriptExhaustedError",
    "ScriptedModel",
    "ScriptedTurn",
    "SummarizeOlder",
    "TextDeltaEvent",
    "TokenCounter",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallDeltaEvent",
    "ToolOutputLimit",
    "ToolRegistry",
    "ToolSource",
    "ToolSpec",
    "TranscriptTooLargeError",
    "Turn",
    "TurnAccumulator",
    "UnsupportedSettingError",
    "UsageEvent",
    "anthropic_messages",
    "anthropic_request",
    "approval_blocks",
    "approve",
    "close_mcp_connections",
    "complete",
    "deny",
    "estimate_tokens",
    "gemini_request",
    "openai_messages",
    "openai_request",
    "responses_input",
    "responses_request",
    "safe_cuts",
    "strict_schema",
    "tool",
    "tool_output_blocks",
    "without_tool_calls",
]
