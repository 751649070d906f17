"""ModelSettings: mapped to each provider's wire names (read from what the fake provider received), overridden
per call by a model middleware, refused when the agent is built if the provider cannot honour them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import anthropic
import openai
import pydantic
import pytest

from plexus.core import AgentId, Item, ItemKind, TextBlock
from plexus.llm import (
    AnthropicModel,
    LLMAgent,
    Middleware,
    ModelCall,
    ModelClient,
    ModelRequest,
    ModelSettings,
    ModelTurn,
    OpenAIChatModel,
    ScriptedModel,
    ScriptedTurn,
    ToolSpec,
    UnsupportedSettingError,
    complete,
    tool,
)
from plexus.runtime import App, Runtime

from .fake_providers import FakeProvider, Sse, anthropic_frames, openai_frames

NOWHERE = "http://127.0.0.1:9"  # never called: the agents below are only built
LOOKUP = ToolSpec("lookup", "Look a word up.", {"type": "object", "properties": {}})


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


def _openai(base_url: str, **kwargs: Any) -> OpenAIChatModel:
    return OpenAIChatModel(openai.AsyncOpenAI(base_url=base_url, api_key="k"), "m", **kwargs)


def _anthropic(base_url: str) -> AnthropicModel:
    return AnthropicModel(anthropic.AsyncAnthropic(base_url=base_url, api_key="k"), "claude")


@tool
def lookup() -> str:
    """Look a word up."""
    return "found"


async def test_openai_settings_reach_the_body_under_their_wire_names() -> None:
    settings = ModelSettings(
        temperature=0.3,
        top_p=0.9,
        max_tokens=321,
        stop=("END", "STOP"),
        seed=7,
        parallel_tool_calls=False,
        tool_choice="lookup",
        reasoning_effort="low",
        service_tier="flex",
        extra_body={"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}},
    )
    async with FakeProvider(lambda _: Sse(openai_frames("ok"))) as fake:
        request = ModelRequest(items=[_user("hi")], tools=[LOOKUP], settings=settings)
        await complete(_openai(fake.base_url), request)
        await complete(_openai(fake.base_url, max_tokens_field="max_completion_tokens"), request)
        await complete(_openai(fake.base_url), replace(request, tools=()))
    body, completion, no_tools = fake.requests
    assert {
        k: body[k] for k in body if k not in ("model", "messages", "tools", "stream", "stream_options")
    } == {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 321,
        "stop": ["END", "STOP"],
        "seed": 7,
        "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "reasoning_effort": "low",
        "service_tier": "flex",
        "top_k": 20,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert completion["max_completion_tokens"] == 321
    assert "max_tokens" not in completion
    # The API refuses tool_choice and parallel_tool_calls without tools: not sent then.
    assert "tool_choice" not in no_tools
    assert "parallel_tool_calls" not in no_tools
    assert no_tools["seed"] == 7


async def test_anthropic_settings_reach_the_body_under_their_wire_names() -> None:
    plain = ModelSettings(
        temperature=0.3,
        top_p=0.9,
        max_tokens=321,
        stop=("END",),
        parallel_tool_calls=False,
        tool_choice="lookup",
        service_tier="standard_only",
        extra_body={"top_k": 20},
    )
    thinking = ModelSettings(
        max_tokens=4096, thinking_budget=2048, tool_choice="auto", parallel_tool_calls=True
    )
    async with FakeProvider(lambda _: Sse(anthropic_frames("ok")), base_path="") as fake:
        model = _anthropic(fake.base_url)
        for settings in (plain, thinking, ModelSettings(tool_choice="required")):
            await complete(model, ModelRequest(items=[_user("hi")], tools=[LOOKUP], settings=settings))
        # The request's own temperature too: the SDK has no keyword for it (it was a TypeError).
        await complete(model, ModelRequest(items=[_user("hi")], temperature=0.4))
    body, thought, required, legacy = fake.requests
    assert {k: body[k] for k in body if k not in ("model", "messages", "tools", "stream")} == {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 321,
        "stop_sequences": ["END"],
        "tool_choice": {"type": "tool", "name": "lookup", "disable_parallel_tool_use": True},
        "service_tier": "standard_only",
        "top_k": 20,
    }
    assert thought["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert thought["max_tokens"] == 4096
    assert thought["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": False}
    assert required["tool_choice"] == {"type": "any"}
    assert required["max_tokens"] == 1024  # the request's own when the settings leave it unset
    assert legacy["temperature"] == 0.4


@pytest.mark.parametrize(
    ("model", "settings", "max_tokens", "setting"),
    [
        (_openai(NOWHERE), ModelSettings(thinking_budget=2048), 4096, "thinking_budget"),
        (_openai(NOWHERE), ModelSettings(reasoning_summary="auto"), 4096, "reasoning_summary"),
        (_anthropic(NOWHERE), ModelSettings(reasoning_summary="auto"), 1024, "reasoning_summary"),
        (_anthropic(NOWHERE), ModelSettings(seed=1), 1024, "seed"),
        (_anthropic(NOWHERE), ModelSettings(reasoning_effort="high"), 1024, "reasoning_effort"),
        (_anthropic(NOWHERE), ModelSettings(service_tier="flex"), 1024, "service_tier"),
        (_anthropic(NOWHERE), ModelSettings(thinking_budget=2048), 2048, "thinking_budget"),
        (_anthropic(NOWHERE), ModelSettings(thinking_budget=2048, max_tokens=1500), 8192, "thinking_budget"),
        (_anthropic(NOWHERE), ModelSettings(thinking_budget=1024, temperature=0.2), 4096, "temperature"),
        (_anthropic(NOWHERE), ModelSettings(thinking_budget=1024, top_p=0.5), 4096, "top_p"),
        (
            _anthropic(NOWHERE),
            ModelSettings(thinking_budget=1024, tool_choice="required"),
            4096,
            "tool_choice",
        ),
    ],
)
def test_a_setting_the_provider_cannot_honour_is_refused_when_the_agent_is_built(
    model: ModelClient, settings: ModelSettings, max_tokens: int, setting: str
) -> None:
    provider = "openai" if isinstance(model, OpenAIChatModel) else "anthropic"
    with pytest.raises(UnsupportedSettingError) as info:
        LLMAgent(model, max_tokens=max_tokens, settings=settings)
    assert isinstance(info.value, ValueError)
    assert (info.value.setting, info.value.provider) == (setting, provider)
    assert setting in str(info.value)
    assert provider in str(info.value)


def test_tool_choice_must_name_a_tool_of_the_agent() -> None:
    with pytest.raises(ValueError, match="'lokup'"):
        LLMAgent(_openai(NOWHERE), tools=[lookup], settings=ModelSettings(tool_choice="lokup"))
    LLMAgent(_openai(NOWHERE), tools=[lookup], settings=ModelSettings(tool_choice="lookup"))


def test_settings_are_a_frozen_validated_json_value_and_merge_per_call_values_first() -> None:
    settings = ModelSettings(temperature=0.5, stop=("x",), seed=3, extra_body={"a": 1, "b": 2})
    assert ModelSettings.model_validate_json(settings.model_dump_json()) == settings
    with pytest.raises(pydantic.ValidationError):
        settings.temperature = 1.0  # type: ignore[misc]
    bad: dict[str, Any]
    for bad in ({"temperature": 3}, {"max_tokens": 0}, {"thinking_budget": 100}, {"stop": []}, {"nope": 1}):
        with pytest.raises(pydantic.ValidationError):
            ModelSettings.model_validate(bad)
    merged = settings.merged(ModelSettings(temperature=0.9, extra_body={"b": 3}))
    assert merged == ModelSettings(temperature=0.9, stop=("x",), seed=3, extra_body={"a": 1, "b": 3})
    assert settings.merged(ModelSettings()) is settings


class Thoughtful(Middleware):
    """Per call: a hotter temperature and a field of the provider's own (the agent's other settings stay)."""

    async def process_model(
        self, context: ModelCall, call_next: Callable[[ModelCall], Awaitable[ModelTurn]]
    ) -> ModelTurn:
        override = ModelSettings(temperature=0.9, extra_body={"user": "u-1"})
        return await call_next(context.with_settings(override))


async def test_a_model_middleware_overrides_the_agents_settings_per_call(
    runtime: Runtime, start_worker: Any
) -> None:
    settings = ModelSettings(temperature=0.2, seed=5, max_tokens=300)
    async with FakeProvider(lambda _: Sse(openai_frames("ok"))) as fake:
        app = App()
        app.register(
            "a", lambda _id: LLMAgent(_openai(fake.base_url), settings=settings, middleware=[Thoughtful()])
        )
        await start_worker(app)
        await runtime.send_message([TextBlock(text="hi")], AgentId("a", "1"), timeout=20)
    (body,) = fake.requests
    assert (body["temperature"], body["seed"], body["max_tokens"], body["user"]) == (0.9, 5, 300, "u-1")


async def test_anthropic_extended_thinking_is_one_setting_of_the_agent(
    runtime: Runtime, start_worker: Any
) -> None:
    frames = anthropic_frames("42.", thinking=("Six times seven.", "sig=="))
    async with FakeProvider(lambda _: Sse(frames), base_path="") as fake:
        app = App()
        settings = ModelSettings(max_tokens=8000, thinking_budget=4000)
        app.register("t", lambda _id: LLMAgent(_anthropic(fake.base_url), settings=settings))
        await start_worker(app)
        reply = await runtime.send_message([TextBlock(text="6*7?")], AgentId("t", "1"), timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["42."]
    (body,) = fake.requests
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4000}
    assert body["max_tokens"] == 8000


async def test_scripted_model_takes_any_settings_and_records_them(
    runtime: Runtime, start_worker: Any
) -> None:
    model = ScriptedModel([ScriptedTurn(text="ok")])
    settings = ModelSettings(seed=1, thinking_budget=2048, reasoning_effort="high")
    app = App()
    app.register("s", lambda _id: LLMAgent(model, settings=settings))
    await start_worker(app)
    await runtime.send_message([TextBlock(text="hi")], AgentId("s", "1"), timeout=20)
    assert [r.settings for r in model.requests] == [settings]


def test_the_mapping_is_computed_once_per_settings_object() -> None:
    """The per-turn cost is a lookup: the agent's build maps its settings, its turns reuse the mapping."""
    model = _openai(NOWHERE)
    agent = LLMAgent(model, settings=ModelSettings(seed=1))
    request = ModelRequest(items=[_user("hi")], settings=agent.settings)
    first = model._settings(request.settings, request.max_tokens, request.temperature)
    again = model._settings(agent.settings, 1024, None)
    assert again is first
    assert model._settings(ModelSettings(seed=1), 1024, None) is not first  # another object: mapped anew


async def test_a_per_call_setting_the_provider_cannot_honour_is_refused_before_any_request() -> None:
    async with FakeProvider(lambda _: Sse(anthropic_frames("ok")), base_path="") as fake:
        request = ModelRequest(items=[_user("hi")]).with_settings(ModelSettings(seed=1))
        with pytest.raises(UnsupportedSettingError, match="seed"):
            await complete(_anthropic(fake.base_url), request)
    assert fake.count == 0
