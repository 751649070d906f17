"""Compaction's token counting per provider: each adapter's count endpoint through the official SDK against
the fakes (the body its stream would send, the answer in the endpoint's shape, errors typed), the estimate
made once per item, and the trigger: no count request unless asked for, then one per model call."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from plexus.core import AgentId, Item, ItemKind, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from plexus.llm import (
    AnthropicModel,
    BadRequestError,
    CompactionPipeline,
    GeminiModel,
    KeepRecent,
    LLMAgent,
    ModelRequest,
    ModelSettings,
    OpenAIChatModel,
    OpenAIResponsesModel,
    RateLimitError,
    ToolSpec,
    _tokencount,
    complete,
    tool,
)
from plexus.runtime import App, Runtime

from .fake_gemini import GeminiCall, gemini_client, gemini_frames
from .fake_providers import Answer, FakeProvider, Sse, Status, anthropic_frames, openai_frames
from .fake_responses import responses_frames

SEARCH = ToolSpec(
    "search",
    "Search the web.",
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)


def _text(kind: ItemKind, text: str) -> Item:
    return Item(kind=kind, blocks=[TextBlock(text=text)])


def _transcript() -> list[Item]:
    """A system prompt, a question, a turn that called a tool, its result and a follow-up."""
    call = ToolUseBlock(call_id="c1", tool_name="search", arguments={"q": "nats"})
    result = ToolResultBlock(call_id="c1", content=[TextBlock(text="NATS is a messaging system.")])
    return [
        _text(ItemKind.SYSTEM, "Be brief."),
        _text(ItemKind.USER, "What is NATS?"),
        Item(kind=ItemKind.ASSISTANT, blocks=[TextBlock(text="Searching."), call]),
        Item(kind=ItemKind.TOOL, blocks=[result]),
        _text(ItemKind.USER, "And JetStream?"),
    ]


# -- each adapter's count endpoint ----------------------------------------------------------------------


async def test_anthropic_counts_with_messages_count_tokens_the_body_its_stream_sends() -> None:
    request = ModelRequest(_transcript(), tools=[SEARCH], settings=ModelSettings(tool_choice="auto"))
    async with FakeProvider(
        lambda _: Sse(anthropic_frames("ok")), base_path="", counter=lambda _: 4321
    ) as fake:
        model = AnthropicModel(anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k"), "fake-claude")
        assert await model.count_tokens(request) == 4321
        await complete(model, request)
    (counted,) = fake.count_requests
    (sent,) = fake.requests
    # The fields count_tokens takes, as the generation call sent them; none that only shape the answer.
    assert counted == {k: sent[k] for k in ("model", "messages", "system", "tools", "tool_choice")}
    assert "max_tokens" in sent
    assert "stream" in sent


async def test_responses_counts_with_input_tokens_count_the_body_its_stream_sends() -> None:
    request = ModelRequest(
        _transcript(),
        tools=[SEARCH],
        settings=ModelSettings(reasoning_effort="low", parallel_tool_calls=False),
    )
    async with FakeProvider(lambda _: Sse(responses_frames("ok")), counter=lambda _: 987) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        model = OpenAIResponsesModel(client, "fake-model")
        assert await model.count_tokens(request) == 987
        await complete(model, request)
    (counted,) = fake.count_requests
    (sent,) = fake.requests
    keys = ("model", "input", "tools", "reasoning", "parallel_tool_calls")
    assert counted == {k: sent[k] for k in keys}
    assert {"stream", "store", "include", "max_output_tokens"} <= set(sent)


async def test_gemini_counts_contents_with_count_tokens_and_estimates_the_system_instruction_and_tools() -> (
    None
):
    """The Developer API's countTokens takes contents only (the SDK refuses the rest): the contents go as
    the stream sends them, thought signatures included; the system instruction and declarations are
    estimated."""

    def respond(body: dict[str, Any]) -> Answer:
        if len(body["contents"]) == 1:
            return Sse(gemini_frames("", [GeminiCall("search", {"q": "nats"}, signature=b"sig-1")]))
        return Sse(gemini_frames("ok"))

    system, question = _text(ItemKind.SYSTEM, "Be brief."), _text(ItemKind.USER, "What is NATS?")
    async with FakeProvider(respond, base_path="", counter=lambda _: 50) as fake:
        model = GeminiModel(gemini_client(fake), "fake-gemini")
        turn = await complete(model, ModelRequest([system, question], tools=[SEARCH]))
        (call,) = turn.tool_calls
        result = ToolResultBlock(call_id=call.call_id, content=[TextBlock(text="a messaging system")])
        request = ModelRequest(
            [system, question, turn.item, Item(kind=ItemKind.TOOL, blocks=[result])], tools=[SEARCH]
        )
        counted = await model.count_tokens(request)
        await complete(model, request)
    (body,) = fake.count_requests
    assert fake.paths[-1].startswith("/v1beta/models/fake-gemini:streamGenerateContent")
    assert body == {"contents": fake.requests[1]["contents"]}
    assert "thoughtSignature" in json.dumps(body)
    declared = len("search") + len(SEARCH.description) + len(json.dumps(SEARCH.parameters))
    assert counted == 50 + (len("Be brief.") + declared) // 4


@pytest.mark.parametrize("provider", ["anthropic", "responses", "gemini"])
async def test_count_errors_are_typed(provider: str) -> None:
    bodies: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "anthropic": (
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}},
        ),
        "responses": (
            {"error": {"message": "slow down", "type": "rate_limit_error", "code": None}},
            {"error": {"message": "bad", "type": "invalid_request_error", "code": None}},
        ),
        "gemini": (
            {"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}},
            {"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}},
        ),
    }
    limited, bad = bodies[provider]
    answers = iter([Status(429, limited, {"retry-after": "7"}), Status(400, bad)])
    base = "" if provider != "responses" else "/v1"
    async with FakeProvider(lambda _: Sse([]), base_path=base, counter=lambda _: next(answers)) as fake:
        model = _client(provider, fake)
        request = ModelRequest([_text(ItemKind.USER, "hi")])
        with pytest.raises(RateLimitError) as slow:
            await model.count_tokens(request)
        with pytest.raises(BadRequestError):
            await model.count_tokens(request)
    assert slow.value.retry_after_s == 7
    assert len(fake.count_requests) == 2  # the SDKs' own retries are off for counts as for calls


def _client(provider: str, fake: FakeProvider) -> AnthropicModel | OpenAIResponsesModel | GeminiModel:
    if provider == "anthropic":
        return AnthropicModel(anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k"), "fake-claude")
    if provider == "responses":
        return OpenAIResponsesModel(openai.AsyncOpenAI(base_url=fake.base_url, api_key="k"), "fake-model")
    return GeminiModel(gemini_client(fake), "fake-gemini")


# -- the estimate ---------------------------------------------------------------------------------------


def test_the_estimate_reads_call_arguments_and_reasoning_and_measures_each_item_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured: list[Item] = []
    memo = _tokencount._ITEM_CHARS
    convert = memo._convert

    def counting(item: Item) -> int:
        measured.append(item)
        return convert(item)

    monkeypatch.setattr(memo, "_convert", counting)
    items = _transcript()
    thinking = Item(kind=ItemKind.ASSISTANT, blocks=[ThinkingBlock(content="x" * 400, signature="s")])
    assert _tokencount.estimate_tokens([thinking]) == 100  # reasoning is read, not a bare "[thinking]"
    call_only = Item(kind=ItemKind.ASSISTANT, blocks=[items[2].blocks[1]])
    assert _tokencount.estimate_tokens([call_only]) == (len("search") + len('{"q": "nats"}')) // 4
    measured.clear()
    first = _tokencount.estimate_tokens(items)
    more = [*items, _text(ItemKind.ASSISTANT, "JetStream persists streams.")]
    second = _tokencount.estimate_tokens(more)
    assert second > first
    # The second conversation's call measured only the item it added.
    assert [i for i in measured if i is more[-1]] == [more[-1]]
    assert len(measured) == len(items) + 1


# -- the trigger ----------------------------------------------------------------------------------------


async def test_the_pipeline_asks_the_provider_only_when_told_and_estimates_after_a_recoverable_error() -> (
    None
):
    answers: list[int | Status] = [
        5000,
        Status(503, {"type": "error", "error": {"type": "overloaded_error"}}),
    ]
    answers.append(Status(401, {"type": "error", "error": {"type": "authentication_error", "message": "no"}}))
    feed = iter(answers)
    items = _transcript()[1:]
    estimate = CompactionPipeline([KeepRecent(1)], context_window=1000, reserve_tokens=0)
    provider = CompactionPipeline(
        [KeepRecent(1)], context_window=1000, reserve_tokens=0, token_count="provider"
    )
    async with FakeProvider(lambda _: Sse([]), base_path="", counter=lambda _: next(feed)) as fake:
        model = AnthropicModel(anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k"), "fake-claude")
        assert await estimate.run(list(items), model=model) == items  # a few estimated tokens: no call
        assert fake.count_requests == []
        assert len(await provider.run(list(items), model=model)) < len(items)  # 5000 counted > 1000
        assert await provider.run(list(items), model=model) == items  # 503: estimated instead
        from plexus.llm import AuthenticationError

        with pytest.raises(AuthenticationError):
            await provider.run(list(items), model=model)
    assert len(fake.count_requests) == 3
    # A model without a count endpoint (Chat Completions) is estimated: nothing asked.
    async with FakeProvider(lambda _: Sse(openai_frames("ok")), counter=lambda _: 5000) as chat:
        chat_model = OpenAIChatModel(openai.AsyncOpenAI(base_url=chat.base_url, api_key="k"), "fake-gpt")
        assert await provider.run(list(items), model=chat_model) == items
    assert chat.count_requests == []
    with pytest.raises(ValueError, match="token_count"):
        CompactionPipeline([], token_count="exact")  # type: ignore[arg-type]


@tool
def search(q: str) -> str:
    """Search the web."""
    return f"results for {q}"


async def test_an_agent_counting_with_the_provider_asks_once_per_model_call_and_compacts_by_the_count(
    runtime: Runtime, start_worker: Any
) -> None:
    def respond(body: dict[str, Any]) -> Answer:
        if "look it up" in json.dumps(body["messages"][-1]):
            return Sse(anthropic_frames("", [("c1", "search", '{"q": "nats"}')]))
        return Sse(anthropic_frames("done"))

    def count(body: dict[str, Any]) -> int:
        return 300 * len(body["messages"])  # over 1000 from 4 messages on

    async with FakeProvider(respond, base_path="", counter=count) as fake:
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k")

        def agent(token_count: Any) -> Any:
            pipeline = CompactionPipeline(
                [KeepRecent(3)], context_window=1000, reserve_tokens=0, token_count=token_count
            )
            return lambda _id: LLMAgent(
                AnthropicModel(client, "fake-claude"), system="Be brief.", tools=[search], compaction=pipeline
            )

        app = App()
        app.register("counted", agent("provider"))
        app.register("estimated", agent("estimate"))
        await start_worker(app)
        for agent_type in ("counted", "estimated"):
            for text in ("look it up", "thanks"):
                blocks = [TextBlock(text=text)]
                await runtime.send_message(blocks, AgentId(agent_type, "k", app.namespace), timeout=30)
    counted, estimated = fake.requests[:3], fake.requests[3:]
    # Three model calls (a tool round, then the second message), one count before each, of what was sent.
    assert len(fake.count_requests) == 3
    system = [{"type": "text", "text": "Be brief."}]
    assert all(c["system"] == system and c["tools"][0]["name"] == "search" for c in fake.count_requests)
    assert [len(c["messages"]) for c in fake.count_requests] == [1, 3, 5]
    assert [len(r["messages"]) for r in counted] == [1, 3, 4]  # the third compacted (pair kept whole)
    assert [len(r["messages"]) for r in estimated] == [1, 3, 5]  # a few estimated tokens: never compacted
