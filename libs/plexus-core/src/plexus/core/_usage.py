"""Token and cost accounting (`Usage`, `Cost`) and the normalised `FinishReason`.

Token fields are normalised across providers (seed 000, seed 002): ``input_tokens`` counts every prompt
token, cached and cache-written ones included, so ``cached_tokens`` and ``cache_write_tokens`` are parts of
it; ``reasoning_tokens`` is a part of ``output_tokens``. Adapters whose provider reports them apart (for
example Anthropic's ``input_tokens``, which excludes cache reads and writes) add them up before they build a
`Usage`. The model refuses counts that break these rules, which catches an adapter that forgot to.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ._json import JsonObject

__all__ = ["Cost", "CostBreakdown", "FinishReason", "FinishReasonKind", "Usage"]

_Tokens = Annotated[int, Field(ge=0, strict=True)]
_Money = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_CURRENCY_RE = re.compile(r"[A-Z]{3}")


class CostBreakdown(BaseModel):
    """How a `Cost` splits by token class (seed 004 ``UsageCost``).

    The parts need not add up to ``Cost.amount``: providers also bill things outside these four (searches,
    tool fees), and each part may be rounded on its own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: _Money = 0.0
    output: _Money = 0.0
    cache_read: _Money = 0.0
    cache_write: _Money = 0.0

    def __add__(self, other: CostBreakdown) -> CostBreakdown:
        if not isinstance(other, CostBreakdown):
            return NotImplemented
        return CostBreakdown(
            input=self.input + other.input,
            output=self.output + other.output,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
        )


class Cost(BaseModel):
    """Money spent on one or more calls.

    ``provider_amount`` holds the provider's own decimal string (``"0.0012345"``) so that the exact figure
    survives float rounding. Two costs add only when their currencies match.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    amount: _Money
    currency: str = "USD"
    provider_amount: str | None = None
    breakdown: CostBreakdown | None = None

    @field_validator("currency")
    @classmethod
    def _v_currency(cls, v: str) -> str:
        if not _CURRENCY_RE.fullmatch(v):
            raise ValueError(f"currency must be an ISO 4217 code of three upper-case letters, got {v!r}")
        return v

    @field_validator("provider_amount")
    @classmethod
    def _v_provider_amount(cls, v: str | None) -> str | None:
        if v is not None and v.strip() == "":
            raise ValueError("provider_amount must not be blank; use None when the provider sent none")
        return v

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        if self.currency != other.currency:
            raise ValueError(
                f"cannot add costs in different currencies: {self.currency} and {other.currency}"
            )
        # A part missing on either side would make a summed breakdown look complete when it is not.
        breakdown = None
        if self.breakdown is not None and other.breakdown is not None:
            breakdown = self.breakdown + other.breakdown
        return Cost(
            amount=self.amount + other.amount,
            currency=self.currency,
            provider_amount=_add_decimal_strings(self.provider_amount, other.provider_amount),
            breakdown=breakdown,
        )


def _add_decimal_strings(a: str | None, b: str | None) -> str | None:
    """Exact sum of two provider amounts, or None when either is missing or is not a finite decimal."""
    if a is None or b is None:
        return None
    try:
        total = Decimal(a) + Decimal(b)
    except InvalidOperation:
        return None
    return str(total) if total.is_finite() else None


class Usage(BaseModel):
    """Token counts and cost of one or more model calls. Additive: ``a + b``, ``sum(usages)``.

    ``cost=None`` means the provider reported none, so it adds as nothing: ``None + c == c``. Metadata merges
    key by key and the right operand wins a clash; addition is commutative only when the keys don't clash.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: _Tokens = 0
    cached_tokens: _Tokens = 0
    cache_write_tokens: _Tokens = 0
    output_tokens: _Tokens = 0
    reasoning_tokens: _Tokens = 0
    cost: Cost | None = None
    metadata: JsonObject = Field(default_factory=dict)

    @model_validator(mode="after")
    def _v_parts(self) -> Self:
        if self.cached_tokens + self.cache_write_tokens > self.input_tokens:
            raise ValueError(
                f"cached_tokens ({self.cached_tokens}) + cache_write_tokens ({self.cache_write_tokens}) "
                f"exceed input_tokens ({self.input_tokens}); input_tokens must include cached and "
                "cache-written tokens"
            )
        if self.reasoning_tokens > self.output_tokens:
            raise ValueError(
                f"reasoning_tokens ({self.reasoning_tokens}) exceed output_tokens ({self.output_tokens}); "
                "output_tokens must include reasoning tokens"
            )
        return self

    @classmethod
    def zero(cls) -> Usage:
        """The identity of ``+``."""
        return cls()

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        if self.cost is None:
            cost = other.cost
        elif other.cost is None:
            cost = self.cost
        else:
            cost = self.cost + other.cost
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cost=cost,
            metadata={**self.metadata, **other.metadata},
        )

    def __radd__(self, other: int) -> Usage:
        # sum() starts from the int 0.
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented


class FinishReasonKind(StrEnum):
    """Why a model stopped, normalised (seed 002). The loop branches on this, never on provider strings."""

    COMPLETED = "completed"
    TOOL_CALL = "tool_call"
    MAX_TOKENS = "max_tokens"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"
    ERROR = "error"
    OTHER = "other"


_K = FinishReasonKind
# Keys are lower-cased provider values. Anthropic's "pause_turn" means "a server-side tool loop paused;
# send the response back to continue": the loop behaviour of TOOL_CALL (call the model again), not COMPLETED.
_PROVIDER_TABLES: dict[str, dict[str, FinishReasonKind]] = {
    "openai": {
        "stop": _K.COMPLETED,
        "tool_calls": _K.TOOL_CALL,
        "function_call": _K.TOOL_CALL,
        "length": _K.MAX_TOKENS,
        "content_filter": _K.BLOCKED,
    },
    "anthropic": {
        "end_turn": _K.COMPLETED,
        "stop_sequence": _K.COMPLETED,
        "tool_use": _K.TOOL_CALL,
        "pause_turn": _K.TOOL_CALL,
        "max_tokens": _K.MAX_TOKENS,
        "model_context_window_exceeded": _K.MAX_TOKENS,
        "refusal": _K.BLOCKED,
    },
    "gemini": {
        "stop": _K.COMPLETED,
        "max_tokens": _K.MAX_TOKENS,
        "safety": _K.BLOCKED,
        "recitation": _K.BLOCKED,
        "blocklist": _K.BLOCKED,
        "prohibited_content": _K.BLOCKED,
        "spii": _K.BLOCKED,
        "image_safety": _K.BLOCKED,
        "malformed_function_call": _K.ERROR,
    },
}
_PROVIDER_ALIASES = {
    "azure": "openai",
    "azure_openai": "openai",
    "openrouter": "openai",
    "google": "gemini",
    "vertex": "gemini",
    "vertex_ai": "gemini",
}
# For providers we have no table for. The tables agree wherever they share a value (a test pins that),
# so their union is safe to use.
_ANY_PROVIDER: dict[str, FinishReasonKind] = {k: v for t in _PROVIDER_TABLES.values() for k, v in t.items()}


class FinishReason(BaseModel):
    """A normalised stop reason; ``raw`` keeps the provider's own value (required for ``OTHER``).

    Compare ``reason.kind``: two reasons of the same kind with different ``raw`` values are different
    values. The loop treats ``OTHER`` like ``COMPLETED`` and logs ``raw``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FinishReasonKind
    raw: str | None = None

    @model_validator(mode="after")
    def _v_raw(self) -> Self:
        if self.kind is FinishReasonKind.OTHER and not self.raw:
            raise ValueError("FinishReason of kind 'other' needs the provider's raw value in 'raw'")
        return self

    @classmethod
    def completed(cls, raw: str | None = None) -> FinishReason:
        return cls(kind=FinishReasonKind.COMPLETED, raw=raw)

    @classmethod
    def tool_call(cls, raw: str | None = None) -> FinishReason:
        return cls(kind=FinishReasonKind.TOOL_CALL, raw=raw)

    @classmethod
    def max_tokens(cls, raw: str | None = None) -> FinishReason:
        return cls(kind=FinishReasonKind.MAX_TOKENS, raw=raw)

    @classmethod
    def cancelled(cls, raw: str | None = None) -> FinishReason:
        return cls(kind=FinishReasonKind.CANCELLED, raw=raw)

    @classmethod
    def blocked(cls, raw: str | None = None) -> FinishReason:
        return cls(kind=FinishReasonKind.BLOCKED, raw=raw)

    @classmethod
    def error(cls, raw: str | None = None) -> FinishReason:
        return cls(kind=FinishReasonKind.ERROR, raw=raw)

    @classmethod
    def other(cls, raw: str) -> FinishReason:
        return cls(kind=FinishReasonKind.OTHER, raw=raw)

    @classmethod
    def from_provider(cls, provider: str, raw: str) -> FinishReason:
        """Map a provider's stop value (``"stop"``, ``"end_turn"``, ``"SAFETY"``…); unknown values → OTHER.

        `provider` is matched case-insensitively (``openai``, ``anthropic``, ``gemini`` and aliases such as
        ``azure``, ``openrouter``, ``vertex``); for any other provider every known table is consulted.
        """
        if not raw or not raw.strip():
            raise ValueError(f"finish reason from {provider!r} is empty; there is nothing to normalise")
        name = provider.strip().lower()
        table = _PROVIDER_TABLES.get(_PROVIDER_ALIASES.get(name, name), _ANY_PROVIDER)
        kind = table.get(raw.strip().lower(), FinishReasonKind.OTHER)
        return cls(kind=kind, raw=raw)

    def __str__(self) -> str:
        if self.kind is FinishReasonKind.OTHER:
            return f"other({self.raw})"
        return self.kind.value
