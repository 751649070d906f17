"""`ModelSettings`: the sampling and request settings of a model call, one value for every provider.

`LLMAgent(settings=...)` sends them with every call; a model middleware overrides them for one call
(``context.with_settings(ModelSettings(...))``). Each adapter maps them to its wire names and refuses what
its provider cannot honour (`UnsupportedSettingError`), when the agent is built. `SettingsCache` keeps an
adapter's mapping per settings object, so a turn pays a dict lookup, not the mapping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from plexus.core import JsonValue, KernelError

__all__ = ["ModelSettings", "ProviderKwargs", "SettingsCache", "UnsupportedSettingError"]

#: The ``tool_choice`` values every provider knows; any other string is the name of a tool to call.
TOOL_CHOICES = ("auto", "none", "required")


class UnsupportedSettingError(KernelError, ValueError):
    """A `ModelSettings` value a provider cannot honour (``setting`` names it, ``provider`` the adapter)."""

    fields: ClassVar[tuple[str, ...]] = ("message", "setting", "provider")

    def __init__(self, message: str, setting: str = "", provider: str = "") -> None:
        super().__init__(message)
        self.setting = setting
        self.provider = provider


class ModelSettings(BaseModel):
    """Settings of a model call; None means "not set" (the provider's default, or the value under it).

    ``max_tokens`` and ``temperature`` win over `ModelRequest`'s fields of the same names. ``tool_choice``:
    ``auto``, ``none``, ``required`` or a tool's name (that tool must be called); it and
    ``parallel_tool_calls`` are sent only with tools on offer. ``reasoning_effort`` is OpenAI's,
    ``reasoning_summary`` the Responses API's (summaries of the reasoning streamed as thinking);
    ``thinking_budget`` Anthropic's extended thinking (``budget_tokens``, at least 1024, below
    ``max_tokens``). ``extra_body``: fields merged into the JSON body as they are (the SDKs' ``extra_body``).
    JSON-serialisable: ``model_dump(mode="json")`` / ``model_validate``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    max_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None
    stop: Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(min_length=1)] | None = None
    seed: Annotated[int, Field(strict=True)] | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: Annotated[str, Field(min_length=1)] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = None
    thinking_budget: Annotated[int, Field(ge=1024, strict=True)] | None = None
    service_tier: Annotated[str, Field(min_length=1)] | None = None
    extra_body: dict[str, JsonValue] | None = None

    def merged(self, over: ModelSettings) -> ModelSettings:
        """These settings with ``over``'s set values winning (``extra_body`` merged key by key)."""
        update = {k: v for k in type(over).model_fields if (v := getattr(over, k)) is not None}
        if not update:
            return self
        if self.extra_body and "extra_body" in update:
            update["extra_body"] = {**self.extra_body, **update["extra_body"]}
        return self.model_copy(update=update)


#: An adapter's mapping of settings: (the fields of every request, the fields sent only with tools).
ProviderKwargs = tuple[dict[str, Any], dict[str, Any]]
#: What a mapping is computed from: the settings, and the request's own max_tokens and temperature.
_Mapper = Callable[[ModelSettings, int, float | None], ProviderKwargs]


class SettingsCache:
    """An adapter's `ProviderKwargs` per settings object (by identity: the agent's lives as long as it does),
    request max_tokens and temperature; the last few kept, so agents sharing a model do not evict each other.
    """

    def __init__(self, mapper: _Mapper, size: int = 16) -> None:
        self._mapper = mapper
        self._size = size
        #: key -> (the settings, kept alive so their id is not reused while cached; the mapping)
        self._kept: dict[tuple[int, int, float | None], tuple[ModelSettings, ProviderKwargs]] = {}

    def __call__(self, settings: ModelSettings, max_tokens: int, temperature: float | None) -> ProviderKwargs:
        key = (id(settings), max_tokens, temperature)
        kept = self._kept.get(key)
        if kept is not None:
            return kept[1]
        mapped = self._mapper(settings, max_tokens, temperature)
        if len(self._kept) >= self._size:
            del self._kept[next(iter(self._kept))]
        self._kept[key] = (settings, mapped)
        return mapped
