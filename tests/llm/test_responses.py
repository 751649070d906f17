"""OpenAIResponsesModel through the official SDK against a fake Responses API on loopback: golden request
bodies, streamed reasoning, text and split parallel calls, reasoning items round-tripped (checked by the
fake as the real service checks them), finish reasons, usage, typed errors and bad streams."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from plexus.core import (
    AgentId,
    FinishReasonKind,
    ImageBlock,
    Item,
    ItemKind,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
)
from plexus.llm import (
    INVALID_ARGUMENTS_KEY,
    RESPONSES_ITEM,
    AuthenticationError,
    BadRequestError,
    LLMAgent,
    ModelRequest,
    ModelSettings,
    OpenAIResponsesModel,
    ProviderUnavailableError,
    RateLimitError,
    ToolSpec,
    UnsupportedSettingError,
    complete,
    responses_input,
    tool,
)
from plexus.runtime import App, Runtime

from .fake_providers import Drop, FakeProvider, Sse, Status
from .fake_responses import Reasoning, ReasoningLedger, event_frame, responses_frames

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
SEARCH = ToolSpec("search", "Search the web.", {"type": "object", "properties": {"q": {"type": "string"}}})


def _model(fake: FakeProvider) -> OpenAIResponsesModel:
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test-key", max_retries=0)
    return OpenAIResponsesModel(client, "fake-model")


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


async def test_reasoning_text_and_parallel_split_calls_stream_into_one_turn() -> None:
    calls = [("call_a", "search", '{"q": "nats jetstream"}'), ("call_b", "now", "")]
    reasoning = Reasoning(["First I look", "then I answer."], "ENC-1", id="rs_1")
    frames = responses_frames("Let me look.", calls, reasoning=reasoning, split=3, usage=(40, 30, 16, 12))
    async with FakeProvider(lambda _: Sse(frames)) as fake:
        turn = await complete(_model(fake), ModelRequest(items=[_user("hi")], tools=[SEARCH]))
    thinking = turn.item.blocks[0]
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.content == "First I look\n\nthen I answer."
    assert thinking.signature is not None
    assert json.loads(thinking.signature) == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [
            {"type": "summary_text", "text": "First I look"},
            {"type": "summary_text", "text": "then I answer."},
        ],
        "encrypted_content": "ENC-1",
    }
    assert turn.item.blocks[1:] == [
        TextBlock(text="Let me look."),
        ToolUseBlock(call_id="call_a", tool_name="search", arguments={"q": "nats jetstream"}),
        ToolUseBlock(call_id="call_b", tool_name="now", arguments={}),
    ]
    assert turn.finish_reason.kind is FinishReasonKind.TOOL_CALL
    u = turn.usage
    assert (u.input_tokens, u.cached_tokens, u.output_tokens, u.reasoning_tokens) == (40, 16, 30, 12)
    assert fake.paths == ["/v1/responses"]


async def test_golden_request_body() -> None:
    """The request against the documented Responses shape: stateless with the encrypted reasoning asked for,
    system-like kinds as system/developer messages, the reasoning item back as issued and before its calls,
    function calls with JSON-text arguments, one output per call (the unanswered one as cancelled), flat
    non-strict tools, settings under their Responses names, metadata never sent."""
    issued = {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "ENC-9"}
    items = [
        Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text="Be brief.")]),
        Item(kind=ItemKind.DEVELOPER, blocks=[TextBlock(text="Use tools.")]),
        Item(
            kind=ItemKind.USER, blocks=[TextBlock(text="look", metadata={"secret": 1}), ImageBlock(data=PNG)]
        ),
        Item(
            kind=ItemKind.ASSISTANT,
            blocks=[
                ThinkingBlock(content="", signature=json.dumps(issued)),
                ThinkingBlock(content="claude's", signature="anthropic-signature"),
                TextBlock(text="Looking."),
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
    settings = ModelSettings(
        reasoning_effort="high", reasoning_summary="auto", tool_choice="search", parallel_tool_calls=False
    )
    request = ModelRequest(items=items, tools=[SEARCH], max_tokens=50, temperature=0.0, settings=settings)
    async with FakeProvider(lambda _: Sse(responses_frames("ok"))) as fake:
        await complete(_model(fake), request)
    body: dict[str, Any] = fake.requests[0]
    assert body == {
        "model": "fake-model",
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "max_output_tokens": 50,
        "temperature": 0.0,
        "reasoning": {"effort": "high", "summary": "auto"},
        "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "name": "search"},
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Search the web.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                "strict": False,
            }
        ],
        "input": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Use tools."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,iVBORw0KGgoAAAAAAAAAAA==",
                        "detail": "auto",
                    },
                ],
            },
            issued,
            {"role": "assistant", "content": "Looking."},
            {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{"q": "x"}'},
            {"type": "function_call", "call_id": "c2", "name": "slow", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "found"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": "[no result: the call was cancelled before it finished]",
            },
            {"role": "user", "content": [{"type": "input_text", "text": "and?"}]},
        ],
    }
    assert "metadata" not in json.dumps(body)
    assert "terminate" not in json.dumps(body)


async def test_the_reasoning_item_round_trips_and_the_fake_refuses_it_changed_or_missing() -> None:
    """Turn 1 reasons and calls a tool; turn 2 sends the reasoning item back as issued (the fake accepts it).
    The same transcript with the encrypted content changed, or without the reasoning item, is refused with a
    400 as the real service refuses it: typed BadRequestError."""
    reasoning = Reasoning(["Plan."], "ENC-ORIGINAL", id="rs_7")
    answers = iter(
        [
            Sse(responses_frames("", [("call_1", "search", '{"q": "a"}')], reasoning=reasoning)),
            Sse(responses_frames("done")),
        ]
    )
    ledger = ReasoningLedger(lambda _: next(answers))
    async with FakeProvider(ledger) as fake:
        model = _model(fake)
        first = await complete(model, ModelRequest(items=[_user("hi")], tools=[SEARCH]))
        result = Item(
            kind=ItemKind.TOOL, blocks=[ToolResultBlock(call_id="call_1", content=[TextBlock(text="r")])]
        )
        items = [_user("hi"), first.item, result]
        second = await complete(model, ModelRequest(items=items, tools=[SEARCH]))
        assert second.item.text == "done"
        sent = [i for i in fake.requests[1]["input"] if i.get("type") == "reasoning"]
        assert sent == [ledger.issued["rs_7"]]

        thinking = first.item.blocks[0]
        assert isinstance(thinking, ThinkingBlock)
        assert thinking.signature is not None
        changed = thinking.model_copy(
            update={"signature": thinking.signature.replace("ENC-ORIGINAL", "ENC-TAMPERED")}
        )
        tampered = first.item.model_copy(update={"blocks": [changed, *first.item.blocks[1:]]})
        with pytest.raises(BadRequestError) as info:
            await complete(model, ModelRequest(items=[_user("hi"), tampered, result], tools=[SEARCH]))
        assert info.value.status == 400
        assert "could not be verified" in str(info.value)

        dropped = first.item.model_copy(update={"blocks": first.item.blocks[1:]})
        with pytest.raises(BadRequestError, match="without its required 'reasoning' item"):
            await complete(model, ModelRequest(items=[_user("hi"), dropped, result], tools=[SEARCH]))
    assert len(ledger.refusals) == 2


def test_reasoning_nothing_follows_and_other_providers_thinking_are_not_sent() -> None:
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E"}
    cut = Item(kind=ItemKind.ASSISTANT, blocks=[ThinkingBlock(content="", signature=json.dumps(item))])
    other = Item(
        kind=ItemKind.ASSISTANT, blocks=[ThinkingBlock(content="t", signature="sig"), TextBlock(text="a")]
    )
    assert responses_input([_user("q"), cut, other]) == [
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"role": "assistant", "content": "a"},
    ]


@pytest.mark.parametrize(
    ("reason", "kind"),
    [("max_output_tokens", FinishReasonKind.MAX_TOKENS), ("content_filter", FinishReasonKind.BLOCKED)],
)
async def test_an_incomplete_response_maps_to_its_finish_reason(reason: str, kind: FinishReasonKind) -> None:
    async with FakeProvider(lambda _: Sse(responses_frames("partial", incomplete=reason))) as fake:
        turn = await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert turn.finish_reason.kind is kind
    assert turn.finish_reason.raw == reason
    assert turn.item.text == "partial"


async def test_an_unknown_output_item_is_kept_and_sent_back_as_it_came() -> None:
    future = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}}
    async with FakeProvider(lambda _: Sse(responses_frames("answer", items=[future]))) as fake:
        model = _model(fake)
        turn = await complete(model, ModelRequest(items=[_user("hi")]))
        assert turn.item.blocks == [
            UnknownBlock.from_dict({"type": RESPONSES_ITEM, "item": future}),
            TextBlock(text="answer"),
        ]
        restored = Item.model_validate_json(turn.item.model_dump_json())  # through the journal's JSON
        await complete(model, ModelRequest(items=[_user("hi"), restored, _user("more")]))
    assert fake.requests[1]["input"][1:3] == [future, {"role": "assistant", "content": "answer"}]


async def test_malformed_arguments_are_kept_raw_for_an_error_the_model_sees() -> None:
    frames = responses_frames("", [("call_x", "search", '{"q": ')])
    async with FakeProvider(lambda _: Sse(frames)) as fake:
        turn = await complete(_model(fake), ModelRequest(items=[_user("hi")], tools=[SEARCH]))
    (call,) = turn.tool_calls
    assert call.arguments == {}
    invalid = call.metadata[INVALID_ARGUMENTS_KEY]
    assert isinstance(invalid, dict)
    assert invalid["raw"] == '{"q": '


@tool
def search(q: str) -> str:
    """Search the web."""
    return f"found {q}"


async def test_an_agent_answers_malformed_arguments_and_an_unknown_item_and_goes_on(
    runtime: Runtime, start_worker: Any
) -> None:
    """Bad input inside a turn (a call whose arguments are not JSON, an item type nobody knows) fails nothing:
    the call gets an error result the model reads on the next call, the unknown item goes back with it."""
    future = {"type": "future_item", "id": "fi_1"}

    def respond(body: dict[str, Any]) -> Sse:
        if any(i.get("type") == "function_call_output" for i in body["input"]):
            return Sse(responses_frames("recovered"))
        return Sse(responses_frames("", [("call_bad", "search", '{"q": nope}')], items=[future]))

    async with FakeProvider(respond) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        app = App()
        app.register("searcher", lambda _id: LLMAgent(OpenAIResponsesModel(client, "m"), tools=[search]))
        await start_worker(app)
        reply = await runtime.send_message([TextBlock(text="find")], AgentId("searcher", "s1"), timeout=30)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["recovered"]
    second = fake.requests[1]["input"]
    assert future in second
    (output,) = [i for i in second if i.get("type") == "function_call_output"]
    assert output["call_id"] == "call_bad"
    assert "not valid JSON" in output["output"]


async def test_a_stream_without_a_completion_event_is_provider_unavailable() -> None:
    async with FakeProvider(lambda _: Sse(responses_frames("never finished", end=False))) as fake:
        with pytest.raises(ProviderUnavailableError, match="without a completion event"):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))


async def test_a_stream_dropped_mid_way_is_provider_unavailable() -> None:
    frames = responses_frames("a long answer that never ends", [("c", "f", '{"a": 1}')])
    async with FakeProvider(lambda _: Drop(frames[:6])) as fake:
        with pytest.raises(ProviderUnavailableError):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert fake.count == 1


async def test_429_500_401_and_a_failed_response_are_typed() -> None:
    answer = Status(429, {"error": {"message": "slow down", "type": "rate_limit"}}, {"retry-after": "7"})
    async with FakeProvider(lambda _: answer) as fake:
        with pytest.raises(RateLimitError) as info:
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    assert (info.value.retry_after_s, info.value.status, fake.count) == (7.0, 429, 1)
    async with FakeProvider(lambda _: Status(500, {"error": {"message": "boom"}})) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=2)
        with pytest.raises(ProviderUnavailableError) as unavailable:
            await complete(OpenAIResponsesModel(client, "m"), ModelRequest(items=[_user("hi")]))
    assert (unavailable.value.status, fake.count) == (500, 1)  # the SDK's own retries are off
    async with FakeProvider(lambda _: Status(401, {"error": {"message": "bad key"}})) as fake:
        with pytest.raises(AuthenticationError):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    failure = {"code": "rate_limit_exceeded", "message": "too many tokens"}
    response = {"id": "resp_fake", "object": "response", "status": "failed", "output": [], "error": failure}
    failed = [*responses_frames("x", end=False)[:1], event_frame("response.failed", 9, response=response)]
    async with FakeProvider(lambda _: Sse(failed)) as fake:
        with pytest.raises(RateLimitError, match="too many tokens"):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))
    error = [event_frame("error", code="server_error", message="oops")]
    async with FakeProvider(lambda _: Sse(error)) as fake:
        with pytest.raises(ProviderUnavailableError, match="oops"):
            await complete(_model(fake), ModelRequest(items=[_user("hi")]))


@pytest.mark.parametrize("setting", ["thinking_budget", "seed", "stop"])
def test_a_setting_the_responses_api_cannot_honour_is_refused_when_the_agent_is_built(setting: str) -> None:
    values: dict[str, Any] = {"thinking_budget": 2048, "seed": 1, "stop": ("x",)}
    model = OpenAIResponsesModel(openai.AsyncOpenAI(base_url="http://127.0.0.1:9", api_key="k"), "m")
    with pytest.raises(UnsupportedSettingError) as info:
        LLMAgent(model, max_tokens=4096, settings=ModelSettings(**{setting: values[setting]}))
    assert (info.value.setting, info.value.provider) == (setting, "openai")
