"""Typed provider errors. Adapters map their SDK's exceptions onto these; the loop and middleware branch on
the type (retry a `RateLimitError` after ``retry_after_s``, never retry an `AuthenticationError`)."""

from __future__ import annotations

from typing import Any, ClassVar

from plexus.core import KernelError

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ContextTooLongError",
    "OutputValidationError",
    "ProviderError",
    "ProviderProtocolError",
    "ProviderUnavailableError",
    "RateLimitError",
    "TranscriptTooLargeError",
]


class ProviderError(KernelError):
    """A model provider refused or failed a call. ``status`` is the HTTP status (0: no response)."""

    fields: ClassVar[tuple[str, ...]] = ("message", "provider", "status")

    def __init__(self, message: str, provider: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status


class RateLimitError(ProviderError):
    """HTTP 429; ``retry_after_s`` is the provider's ``retry-after`` when it sent one."""

    fields: ClassVar[tuple[str, ...]] = ("message", "provider", "status", "retry_after_s")
    recoverable = True

    def __init__(
        self, message: str, provider: str = "", status: int = 429, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, provider, status)
        self.retry_after_s = retry_after_s


class ContextTooLongError(ProviderError):
    """The prompt does not fit the model's context window: compact the transcript, do not retry as is."""


class AuthenticationError(ProviderError):
    """HTTP 401/403: the key is missing, wrong or lacks permission."""


class BadRequestError(ProviderError):
    """HTTP 400/404/422: the request itself is wrong; retrying it unchanged cannot help."""


class ProviderUnavailableError(ProviderError):
    """5xx, a timeout, a refused connection or a stream cut mid-way: retrying later may succeed."""

    recoverable = True


class ProviderProtocolError(ProviderError):
    """The provider answered something that is not its wire format (garbage JSON, events of the wrong
    shape); retrying may help when the cause was a broken proxy, so it counts as recoverable."""

    recoverable = True


class TranscriptTooLargeError(KernelError):
    """The conversation no longer fits in the agent's state: its JSON is ``size`` bytes, over ``limit``
    (`LLMAgent`'s ``max_transcript_bytes``). Raised before the model call, so no call is paid for a turn that
    could not be stored; compact the transcript (``CompactionPipeline(..., max_bytes=...)``) or go on under a
    new key."""

    fields: ClassVar[tuple[str, ...]] = ("message", "size", "limit")

    def __init__(self, message: str, size: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class OutputValidationError(KernelError):
    """The model's final answer did not validate into ``output_type`` after ``output_retries`` retries;
    ``errors`` are the last attempt's validation errors (pydantic's, without their input)."""

    fields: ClassVar[tuple[str, ...]] = ("message", "output_type", "errors")

    def __init__(
        self, message: str = "", output_type: str = "", errors: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.output_type = output_type
        self.errors = list(errors or [])
