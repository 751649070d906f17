"""What `LLMAgent` checks and assembles once, when it is made: its limits, its middleware stages and the
settings its model is asked with (refused now, not at the first call, when its provider cannot honour
them)."""

from __future__ import annotations

from ._client import ModelClient, ModelRequest
from ._genai import GenAITelemetry
from ._handoff import Handoffs
from ._middleware import Middleware, ProviderRetry
from ._settings import TOOL_CHOICES, ModelSettings
from ._tools import ToolRegistry

__all__ = ["check_limits", "check_settings", "middleware_stages"]


def check_limits(max_turns: int, check_max_age: float, max_transcript_bytes: int | None) -> None:
    """ValueError for a limit out of range."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    if not check_max_age >= 0:
        raise ValueError(f"check_max_age must be >= 0, got {check_max_age}")
    if max_transcript_bytes is not None and max_transcript_bytes < 1:
        raise ValueError(f"max_transcript_bytes must be >= 1 or None, got {max_transcript_bytes}")


def middleware_stages(
    middleware: list[Middleware],
    provider_retry: ProviderRetry | None,
    telemetry: GenAITelemetry | None,
) -> tuple[list[Middleware], list[Middleware], list[Middleware]]:
    """The model, tool and message stages' chains: `middleware` with the default `ProviderRetry` (model stage
    only) and `GenAITelemetry` (innermost) added unless `middleware` has one of its own."""
    own = any(isinstance(m, ProviderRetry) for m in middleware)
    # The default retry outermost, so each retry passes the other middleware.
    model = middleware if own or provider_retry is None else [provider_retry, *middleware]
    if telemetry is not None and not any(isinstance(m, GenAITelemetry) for m in middleware):
        others = [*middleware, telemetry]
        return [*model, telemetry], others, others
    return model, middleware, middleware


def check_settings(
    model: ModelClient,
    settings: ModelSettings,
    tools: ToolRegistry,
    handoffs: Handoffs | None,
    max_tokens: int,
    temperature: float | None,
) -> None:
    """Refuse settings the model's provider cannot honour (its adapter's ``check_settings`` raises
    `UnsupportedSettingError`) and a ``tool_choice`` naming no tool of the agent (nor a handoff)."""
    choice = settings.tool_choice
    handoff = handoffs is not None and handoffs.get(choice or "") is not None
    if choice is not None and choice not in TOOL_CHOICES and tools.get(choice) is None and not handoff:
        raise ValueError(
            f"settings.tool_choice {choice!r} is none of {TOOL_CHOICES} nor a tool of this agent"
        )
    check = getattr(model, "check_settings", None)
    if check is not None:
        check(ModelRequest(items=(), max_tokens=max_tokens, temperature=temperature, settings=settings))
