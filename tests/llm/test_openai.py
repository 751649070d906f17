"""OpenAIChatModel through the official SDK against a fake Chat Completions server on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from plexus.core import (
    FinishReasonKind,
    ImageBlock,
    Item,
    ItemKind,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    custom_item,
)
from plexus.llm import (
    AuthenticationError,
    BadRequestError,
    ModelRequest,
    OpenAIChatModel,
    ProviderUnavailableError,
    RateLimitError,
    ToolSpec,
    complete,
)

from .fake_providers import Answer, Drop, FakeProvider, Sse, Status, openai_frames

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8


def _model(fake: FakeProvider) -> OpenAIChatModel:
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test-key", max_retries=0)
    return OpenAIChatModel(client, "fake-model")


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


async def test_text_and_parallel_split_tool_calls_starting_at_index_2() -> None:
    calls = [("call_a", "search", '{"query": "nats jetstream"}'), ("call_b", "now", "")]
    async with FakeProvider(
        lambda _: Sse(openai_frames("Let me look.", calls, first_index=2, split=3))
    ) as fake:
        turn = await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert turn.item.blocks == [
        TextBlock(text="Let me look."),
        ToolUseBlock(call_id="call_a", tool_name="search", arguments={"query": "nats jetstream"}),
        ToolUseBlock(call_id="call_b", tool_name="now", arguments={}),
    ]
    assert turn.finish_reason.kind is FinishReasonKind.TOOL_CALL
    assert turn.finish_reason.raw == "tool_calls"
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (12, 7)
    assert fake.paths == ["/v1/chat/completions"]


async def test_golden_request_body() -> None:
    """The request our adapter sends, against the documented Chat Completions shape: system-like kinds as
    system messages, assistant tool_calls with JSON-text arguments, one tool message per call (the
    unanswered one answered as cancelled), thinking and metadata never sent, images as data URLs."""
    items = [
        Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text="Be brief.")]),
        Item(kind=ItemKind.CONTEXT, blocks=[TextBlock(text="Project: plexus")]),
        custom_item("ui.note", [TextBlock(text="never sent")]),
        Item(
            kind=ItemKind.USER, blocks=[TextBlock(text="look", metadata={"secret": 1}), ImageBlock(data=PNG)]
        ),
        Item(
            kind=ItemKind.ASSISTANT,
            blocks=[
                ThinkingBlock(content="hmm", signature="s"),
                ToolUseBlock(call_id="c1", tool_name="search", arguments={"q": "x"}),
                ToolUseBlock(call_id="c2", tool_name="slow", arguments={}),
            ],
        ),
        Item(
            kind=ItemKind.TOOL,
            blocks=[ToolResultBlock(call_id="c1", content=[TextBlock(text="found")], terminate=True)],
        ),
        _user("and?"),
    ]
    tool = ToolSpec("search", "Search the web.", {"type": "object", "properties": {"q": {"type": "string"}}})
    async with FakeProvider(lambda _: Sse(openai_frames("ok"))) as fake:
        await complete(_model(fake), ModelRequest(items=items, tools=[tool], max_tokens=50, temperature=0.0))
    body: dict[str, Any] = fake.requests[0]
    assert body == {
        "model": "fake-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 50,
        "temperature": 0.0,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "description": "Search the web.",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            }
        ],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": "Project: plexus"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAAAAAAAAA=="},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "x"}'},
                    },
                    {"id": "c2", "type": "function", "function": {"name": "slow", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "found"},
            {
                "role": "tool",
                "tool_call_id": "c2",
                "content": "[no result: the call was cancelled before it finished]",
            },
            {"role": "user", "content": [{"type": "text", "text": "and?"}]},
        ],
    }
    assert "metadata" not in json.dumps(body)
    assert "terminate" not in json.dumps(body)


async def test_429_with_retry_after_is_a_typed_rate_limit() -> None:
    answer = Status(429, {"error": {"message": "slow down", "type": "rate_limit"}}, {"retry-after": "7"})
    async with FakeProvider(lambda _: answer) as fake:
        with pytest.raises(RateLimitError) as info:
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert info.value.retry_after_s == 7.0
    assert info.value.status == 429
    assert fake.count == 1


async def test_500_and_401_are_typed() -> None:
    async with FakeProvider(lambda _: Status(500, {"error": {"message": "boom"}})) as fake:
        with pytest.raises(ProviderUnavailableError) as info:
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert info.value.status == 500
    async with FakeProvider(lambda _: Status(401, {"error": {"message": "bad key"}})) as fake:
        with pytest.raises(AuthenticationError):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))


async def test_connection_dropped_mid_stream_is_provider_unavailable() -> None:
    frames = openai_frames("a long answer that never ends", [("c", "f", '{"a": 1}')])
    async with FakeProvider(lambda _: Drop(frames[:5])) as fake:
        with pytest.raises(ProviderUnavailableError):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert fake.count == 1


async def test_the_sdks_own_retries_are_off() -> None:
    """Retries are Plexus's (ProviderRetry, the run's RetryPolicy): even a client built with the SDK's retries
    on makes one request for a 500 (issue 36 item 9)."""
    async with FakeProvider(lambda _: Status(500, {"error": {"message": "boom"}})) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=1)
        with pytest.raises(ProviderUnavailableError):
            await complete(OpenAIChatModel(client, "m"), ModelRequest(items=[_user("hi")]))
    assert fake.count == 1


async def test_keep_alive_serves_calls_on_one_connection_and_a_drop_closes_it() -> None:
    """The bench's fake keeps connections alive, as real providers do: the SDK's pool reuses one connection
    for calls in a row, errors included; a stream cut mid-way ends its connection and the next call opens
    another."""
    frames = openai_frames("cut", [("c", "f", '{"a": 1}')])
    answers: Iterator[Answer] = iter(
        [
            Sse(openai_frames("one")),
            Status(400, {"error": {"message": "bad"}}),
            Sse(openai_frames("two")),
            Drop(frames[:3]),
            Sse(openai_frames("three")),
        ]
    )
    async with FakeProvider(lambda _: next(answers), keep_alive=True) as fake:
        model = _model(fake)
        assert (await complete(model, ModelRequest(items=[_user("1")]))).item.text == "one"
        with pytest.raises(BadRequestError):
            await complete(model, ModelRequest(items=[_user("2")]))
        assert (await complete(model, ModelRequest(items=[_user("3")]))).item.text == "two"
        assert fake.connections == 1
        with pytest.raises(ProviderUnavailableError):
            await complete(model, ModelRequest(items=[_user("4")]))
        assert (await complete(model, ModelRequest(items=[_user("5")]))).item.text == "three"
    assert (fake.count, fake.connections) == (5, 2)
