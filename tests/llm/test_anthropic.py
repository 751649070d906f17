"""AnthropicModel through the official SDK against a fake Messages API on loopback."""

from __future__ import annotations

from typing import Any

import anthropic
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
)
from plexus.llm import (
    AnthropicModel,
    BadRequestError,
    ModelRequest,
    ProviderUnavailableError,
    RateLimitError,
    ToolSpec,
    complete,
)

from .fake_providers import Drop, FakeProvider, Sse, Status, anthropic_frames

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8


def _model(fake: FakeProvider) -> AnthropicModel:
    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test-key", max_retries=0)
    return AnthropicModel(client, "fake-claude")


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


async def test_thinking_signature_text_and_split_tool_input() -> None:
    frames = anthropic_frames(
        "Checking.",
        [("toolu_1", "search", '{"query": "jetstream"}'), ("toolu_2", "now", "")],
        thinking=("I should search first.", "sig-abc=="),
        split=3,
    )
    async with FakeProvider(lambda _: Sse(frames), base_path="") as fake:
        turn = await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert turn.item.blocks == [
        ThinkingBlock(
            content="I should search first.",
            signature="sig-abc==",
            metadata={"plexus.llm.provider": "anthropic"},  # whose reasoning it is: see test_mixed_providers
        ),
        TextBlock(text="Checking."),
        ToolUseBlock(call_id="toolu_1", tool_name="search", arguments={"query": "jetstream"}),
        ToolUseBlock(call_id="toolu_2", tool_name="now", arguments={}),  # zero-arg: no input_json_delta
    ]
    assert turn.finish_reason.kind is FinishReasonKind.TOOL_CALL
    assert turn.finish_reason.raw == "tool_use"
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (12, 7)
    assert fake.paths == ["/v1/messages"]


async def test_golden_request_body() -> None:
    """Documented Messages shape: system lifted to the top level; thinking re-sent verbatim with its
    signature (unsigned reasoning dropped); all tool_result blocks in ONE user message before any text,
    the unanswered call answered as cancelled; images as base64 with the sniffed media type."""
    items = [
        Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text="Be brief.")]),
        Item(kind=ItemKind.DEVELOPER, blocks=[TextBlock(text="Cite sources.")]),
        Item(kind=ItemKind.USER, blocks=[TextBlock(text="look"), ImageBlock(data=PNG)]),
        Item(
            kind=ItemKind.ASSISTANT,
            blocks=[
                ThinkingBlock(content="plan", signature="sig-1"),
                ThinkingBlock(content="unsigned reasoning from elsewhere"),
                ToolUseBlock(call_id="t1", tool_name="search", arguments={"q": "x"}),
                ToolUseBlock(call_id="t2", tool_name="slow", arguments={}),
            ],
        ),
        Item(kind=ItemKind.TOOL, blocks=[ToolResultBlock(call_id="t1", content=[TextBlock(text="found")])]),
        _user("and?"),
    ]
    tool = ToolSpec("search", "Search.", {"type": "object", "properties": {"q": {"type": "string"}}})
    async with FakeProvider(lambda _: Sse(anthropic_frames("ok")), base_path="") as fake:
        await complete(_model(fake), ModelRequest(items=items, tools=[tool], max_tokens=64))
    body: dict[str, Any] = fake.requests[0]
    assert body == {
        "model": "fake-claude",
        "max_tokens": 64,
        "stream": True,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Cite sources."}],
        "tools": [
            {
                "name": "search",
                "description": "Search.",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            }
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": "iVBORw0KGgoAAAAAAAAAAA==",
                        },
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "plan", "signature": "sig-1"},
                    {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "x"}},
                    {"type": "tool_use", "id": "t2", "name": "slow", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "found"}],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "[no result: the call was cancelled before it finished]",
                        "is_error": True,
                    },
                    {"type": "text", "text": "and?"},
                ],
            },
        ],
    }


async def test_errors_are_typed() -> None:
    limited = Status(
        429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}, {"retry-after": "3"}
    )
    async with FakeProvider(lambda _: limited, base_path="") as fake:
        with pytest.raises(RateLimitError) as info:
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert info.value.retry_after_s == 3.0
    overloaded = Status(529, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    async with FakeProvider(lambda _: overloaded, base_path="") as fake:
        with pytest.raises(ProviderUnavailableError):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    bad = Status(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}})
    async with FakeProvider(lambda _: bad, base_path="") as fake:
        with pytest.raises(BadRequestError):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))


async def test_dropped_stream_is_provider_unavailable() -> None:
    frames = anthropic_frames("a long answer", [("t", "f", '{"a": 1}')])
    async with FakeProvider(lambda _: Drop(frames[:6]), base_path="") as fake:
        with pytest.raises(ProviderUnavailableError):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert fake.count == 1


@pytest.mark.parametrize(
    ("kind", "typed"),
    [
        ("overloaded_error", ProviderUnavailableError),
        ("api_error", ProviderUnavailableError),
        ("rate_limit_error", RateLimitError),
        ("invalid_request_error", BadRequestError),
    ],
)
async def test_an_error_event_after_the_200_is_typed_by_its_error_type(
    kind: str, typed: type[Exception]
) -> None:
    # Anthropic reports an error that happens mid-answer as an `error` event on the open 200 stream.
    error = f'event: error\ndata: {{"type": "error", "error": {{"type": "{kind}", "message": "busy"}}}}\n\n'
    frames = [*anthropic_frames("a long answer")[:3], error]
    async with FakeProvider(lambda _: Sse(frames), base_path="") as fake:
        with pytest.raises(typed) as info:
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert type(info.value) is typed
    assert "busy" in str(info.value)
