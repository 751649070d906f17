"""GeminiModel through the official google-genai SDK against a fake ``streamGenerateContent`` server on
loopback: golden request bodies, parallel calls, thought signatures round-tripped (the fake answers 400 as
the service does when one comes back changed or missing), errors typed, bad input never fatal."""

from __future__ import annotations

import base64
from typing import Any

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
    UnknownBlock,
)
from plexus.llm import (
    INVALID_ARGUMENTS_KEY,
    BadRequestError,
    GeminiModel,
    LLMAgent,
    ModelRequest,
    ModelSettings,
    ProviderProtocolError,
    ProviderUnavailableError,
    RateLimitError,
    ToolSpec,
    UnsupportedSettingError,
    complete,
    gemini_request,
)

from .fake_gemini import (
    MISSING,
    GeminiCall,
    Signatures,
    gemini_chunk,
    gemini_client,
    gemini_frames,
    turn_of,
)
from .fake_providers import Answer, Drop, FakeProvider, Sse, Status

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
NOTE = ToolSpec("note", "Write a note.", {"type": "object", "properties": {"text": {"type": "string"}}})


def _model(fake: FakeProvider) -> GeminiModel:
    return GeminiModel(gemini_client(fake), "fake-gemini")


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


def _results(turn_item: Item, text: str = "ok") -> Item:
    calls = [b for b in turn_item.blocks if isinstance(b, ToolUseBlock)]
    return Item(
        kind=ItemKind.TOOL,
        blocks=[ToolResultBlock(call_id=c.call_id, content=[TextBlock(text=text)]) for c in calls],
    )


def _urlsafe(signature: bytes) -> str:
    return base64.urlsafe_b64encode(signature).decode()


async def test_golden_bodies_parallel_calls_and_signatures_back_unchanged() -> None:
    sigs = Signatures()

    def respond(body: dict[str, Any]) -> Answer:
        if (refused := sigs.check(body)) is not None:
            return refused
        if turn_of(body) == 1:
            calls = [sigs.call("note", {"text": "a"}), GeminiCall("note", {"text": "b"})]
            return Sse(
                gemini_frames("Noting.", calls, thought="Two notes.", thoughts_tokens=3, cached_tokens=4)
            )
        return Sse(gemini_frames("Done.", text_signature=b"\x01\x02"))

    system = Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text="Be brief.")])
    items = [system, _user("note a and b")]
    settings = ModelSettings(temperature=0.2, reasoning_effort="low", stop=("END",), seed=7)
    async with FakeProvider(respond, base_path="") as fake:
        model = _model(fake)
        first = await complete(model, ModelRequest(items, [NOTE], max_tokens=300, settings=settings))
        items += [first.item, _results(first.item)]
        second = await complete(model, ModelRequest(items, [NOTE], max_tokens=300, settings=settings))

    signature = sigs.issued[Signatures.key("note", {"text": "a"})]
    # The first call's signature is a block of its own right after that call; the second call had none.
    assert [type(b).__name__ for b in first.item.blocks] == [
        "ThinkingBlock", "TextBlock", "ToolUseBlock", "ThinkingBlock", "ToolUseBlock",
    ]  # fmt: skip
    made_by = {"plexus.llm.provider": "gemini"}  # whose reasoning it is: see test_mixed_providers
    assert first.item.blocks[0] == ThinkingBlock(content="Two notes.", metadata=made_by)
    assert first.item.blocks[3] == ThinkingBlock(
        content="", redacted=True, signature=base64.b64encode(signature).decode(), metadata=made_by
    )
    assert [b.arguments for b in first.tool_calls] == [{"text": "a"}, {"text": "b"}]
    assert (first.finish_reason.kind, first.finish_reason.raw) == (FinishReasonKind.TOOL_CALL, "STOP")
    assert (first.usage.input_tokens, first.usage.cached_tokens) == (12, 4)
    assert (first.usage.output_tokens, first.usage.reasoning_tokens) == (10, 3)  # candidates + thoughts

    assert fake.paths == ["/v1beta/models/fake-gemini:streamGenerateContent?alt=sse"] * 2
    assert fake.requests[0] == {
        "contents": [{"role": "user", "parts": [{"text": "note a and b"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "note",
                        "description": "Write a note.",
                        "parameters_json_schema": NOTE.parameters,
                    }
                ]
            }
        ],
        "generationConfig": {
            "maxOutputTokens": 300,
            "temperature": 0.2,
            "seed": 7,
            "stopSequences": ["END"],
            # the SDK sends these snake_case (the service reads both spellings)
            "thinkingConfig": {"include_thoughts": True, "thinking_level": "LOW"},
        },
    }
    # Turn 2 carries turn 1 as it came: the thought, the text, both calls (the signature on the first, byte
    # for byte), and one function response per call, by name, in one user content.
    assert fake.requests[1]["contents"][1:] == [
        {
            "role": "model",
            "parts": [
                {"text": "Two notes.", "thought": True},
                {"text": "Noting."},
                {
                    "functionCall": {"name": "note", "args": {"text": "a"}},
                    "thoughtSignature": _urlsafe(signature),
                },
                {"functionCall": {"name": "note", "args": {"text": "b"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "note", "response": {"output": "ok"}}},
                {"functionResponse": {"name": "note", "response": {"output": "ok"}}},
            ],
        },
    ]
    assert [b.text for b in second.item.blocks if isinstance(b, TextBlock)] == ["Done."]
    assert second.item.blocks[-1].signature == base64.b64encode(b"\x01\x02").decode()  # type: ignore[attr-defined]


async def test_a_signature_changed_or_dropped_on_the_way_back_is_refused_by_the_fake_as_by_gemini() -> None:
    sigs = Signatures()

    def respond(body: dict[str, Any]) -> Answer:
        if (refused := sigs.check(body)) is not None:
            return refused
        if turn_of(body) == 1:
            return Sse(gemini_frames("", [sigs.call("note", {"text": "x"})]))
        return Sse(gemini_frames("ok"))

    async with FakeProvider(respond, base_path="") as fake:
        model = _model(fake)
        first = await complete(model, ModelRequest([_user("go")], [NOTE]))
        results = _results(first.item)
        call, carrier = first.item.blocks
        assert isinstance(carrier, ThinkingBlock)
        assert carrier.signature is not None
        changed = carrier.model_copy(update={"signature": base64.b64encode(b"forged").decode()})
        for blocks, message in (([call], MISSING), ([call, changed], "Corrupted thought signature.")):
            turn = first.item.model_copy(update={"blocks": blocks})
            with pytest.raises(BadRequestError) as caught:
                await complete(model, ModelRequest([_user("go"), turn, results], [NOTE]))
            assert caught.value.status == 400
            assert message in caught.value.message
        ok = await complete(model, ModelRequest([_user("go"), first.item, results], [NOTE]))
    assert ok.item.text == "ok"


async def test_calls_the_provider_sent_without_a_signature_go_back_without_one_and_ids_only_when_sent() -> (
    None
):
    calls = [GeminiCall("note", {"text": "a"}, id="fc-1"), GeminiCall("note", {"text": "b"})]

    def respond(body: dict[str, Any]) -> Answer:
        return Sse(gemini_frames("", calls) if turn_of(body) == 1 else gemini_frames("fine"))

    async with FakeProvider(respond, base_path="") as fake:
        model = _model(fake)
        first = await complete(model, ModelRequest([_user("go")], [NOTE]))
        await complete(model, ModelRequest([_user("go"), first.item, _results(first.item)], [NOTE]))
    assert first.tool_calls[0].call_id == "fc-1"
    model_parts = fake.requests[1]["contents"][1]["parts"]
    assert model_parts == [
        {"functionCall": {"id": "fc-1", "name": "note", "args": {"text": "a"}}},
        {"functionCall": {"name": "note", "args": {"text": "b"}}},
    ]
    responses = [p["functionResponse"] for p in fake.requests[1]["contents"][2]["parts"]]
    assert [r.get("id") for r in responses] == ["fc-1", None]


async def test_a_call_left_without_a_result_is_answered_as_cancelled() -> None:
    async with FakeProvider(lambda _: Sse(gemini_frames("again")), base_path="") as fake:
        turn = Item(
            kind=ItemKind.ASSISTANT,
            blocks=[
                ToolUseBlock(call_id="c1", tool_name="note", arguments={}),
                ToolUseBlock(call_id="c2", tool_name="note"),
            ],
        )
        partial = Item(
            kind=ItemKind.TOOL, blocks=[ToolResultBlock(call_id="c1", content=[TextBlock(text="r1")])]
        )
        await complete(_model(fake), ModelRequest([_user("go"), turn, partial, _user("and?")]))
    contents = fake.requests[0]["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user", "user"]
    responses = [p["functionResponse"] for p in contents[2]["parts"]]
    assert [(r["id"], list(r["response"])) for r in responses] == [("c1", ["output"]), ("c2", ["error"])]


async def test_user_media_goes_inline_or_by_uri() -> None:
    async with FakeProvider(lambda _: Sse(gemini_frames("seen")), base_path="") as fake:
        item = Item(
            kind=ItemKind.USER,
            blocks=[
                TextBlock(text="look"),
                ImageBlock(data=PNG),
                ImageBlock(url="https://x/y.png", mime_type="image/png"),
            ],
        )
        await complete(_model(fake), ModelRequest([item]))
    assert fake.requests[0]["contents"][0]["parts"] == [
        {"text": "look"},
        {"inlineData": {"data": _urlsafe(PNG), "mime_type": "image/png"}},  # the SDK spells it so
        {"fileData": {"file_uri": "https://x/y.png", "mime_type": "image/png"}},
    ]


@pytest.mark.parametrize(
    ("finish", "kind"),
    [
        ("SAFETY", FinishReasonKind.BLOCKED),
        ("PROHIBITED_CONTENT", FinishReasonKind.BLOCKED),
        ("MAX_TOKENS", FinishReasonKind.MAX_TOKENS),
        ("MALFORMED_FUNCTION_CALL", FinishReasonKind.ERROR),
        ("LANGUAGE", FinishReasonKind.OTHER),
    ],
)
async def test_finish_reasons_by_the_seed_table(finish: str, kind: FinishReasonKind) -> None:
    async with FakeProvider(lambda _: Sse(gemini_frames("cut", finish=finish)), base_path="") as fake:
        turn = await complete(_model(fake), ModelRequest([_user("go")]))
    assert (turn.finish_reason.kind, turn.finish_reason.raw) == (kind, finish)


async def test_a_blocked_prompt_finishes_blocked() -> None:
    frames = [gemini_chunk(feedback={"blockReason": "SAFETY"}, usage={"promptTokenCount": 5})]
    async with FakeProvider(lambda _: Sse(frames), base_path="") as fake:
        turn = await complete(_model(fake), ModelRequest([_user("bad")]))
    assert (turn.finish_reason.kind, turn.finish_reason.raw) == (FinishReasonKind.BLOCKED, "SAFETY")
    assert turn.item.blocks == []


async def test_unknown_parts_are_kept_and_sent_back_as_they_came() -> None:
    code = {"executableCode": {"code": "print(1)", "language": "PYTHON"}}
    frames = [gemini_chunk([code, {"someFuturePart": {"x": 1}}, {"text": "ran it"}], finish="STOP")]

    def respond(body: dict[str, Any]) -> Answer:
        return Sse(frames if turn_of(body) == 1 else gemini_frames("ok"))

    async with FakeProvider(respond, base_path="") as fake:
        model = _model(fake)
        turn = await complete(model, ModelRequest([_user("run")]))
        await complete(model, ModelRequest([_user("run"), turn.item, _user("again")]))
    kept = [b for b in turn.item.blocks if isinstance(b, UnknownBlock)]
    assert [b.raw["part"] for b in kept] == [code, {}]  # the SDK drops fields it does not know
    assert fake.requests[1]["contents"][1]["parts"] == [code, {"text": "ran it"}]


async def test_malformed_call_arguments_become_an_invalid_arguments_call_or_a_protocol_error() -> None:
    non_finite = Sse(gemini_frames("", [GeminiCall("note", {"text": float("nan")})]))
    async with FakeProvider(lambda _: non_finite, base_path="") as fake:
        turn = await complete(_model(fake), ModelRequest([_user("go")], [NOTE]))
    assert INVALID_ARGUMENTS_KEY in turn.tool_calls[0].metadata  # the loop answers it with an ErrorBlock

    not_an_object = Sse(gemini_frames("", [GeminiCall("note", "oops")]))
    async with FakeProvider(lambda _: not_an_object, base_path="") as fake:
        with pytest.raises(ProviderProtocolError):
            await complete(_model(fake), ModelRequest([_user("go")], [NOTE]))


async def test_429_with_retry_after_is_a_rate_limit_asked_once() -> None:
    busy = Status(
        429,
        {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}},
        {"retry-after": "7"},
    )
    async with FakeProvider(lambda _: busy, base_path="") as fake:
        with pytest.raises(RateLimitError) as caught:
            await complete(_model(fake), ModelRequest([_user("go")]))
    assert (caught.value.retry_after_s, caught.value.recoverable, fake.count) == (7.0, True, 1)


@pytest.mark.parametrize("code", [500, 503])
async def test_5xx_is_recoverable_and_not_retried_by_the_sdk(code: int) -> None:
    down = Status(code, {"error": {"code": code, "message": "down", "status": "UNAVAILABLE"}})
    async with FakeProvider(lambda _: down, base_path="") as fake:
        with pytest.raises(ProviderUnavailableError) as caught:
            await complete(_model(fake), ModelRequest([_user("go")]))
    assert (caught.value.status, caught.value.recoverable, fake.count) == (code, True, 1)


@pytest.mark.parametrize(
    "answer",
    [Drop(gemini_frames("partial answer")[:2]), Sse(gemini_frames("no finish")[:-1])],
    ids=["dropped", "no-finish"],
)
async def test_a_stream_dropped_mid_way_or_ending_without_a_finish_is_unavailable(answer: Answer) -> None:
    async with FakeProvider(lambda _: answer, base_path="") as fake:
        with pytest.raises(ProviderUnavailableError):
            await complete(_model(fake), ModelRequest([_user("go")]))


def test_settings_gemini_cannot_honour_are_refused_when_the_agent_is_built() -> None:
    from google import genai

    model = GeminiModel(genai.Client(api_key="k"), "m")
    for settings in (
        ModelSettings(service_tier="flex"),
        ModelSettings(parallel_tool_calls=False),
        ModelSettings(reasoning_effort="max"),
        ModelSettings(reasoning_summary="auto"),
        ModelSettings(reasoning_effort="low", thinking_budget=2048),
    ):
        with pytest.raises(UnsupportedSettingError):
            LLMAgent(model, settings=settings)


def test_thinking_budget_tool_choice_and_typed_output_in_the_config() -> None:
    from plexus.llm import OutputSpec

    settings = ModelSettings(thinking_budget=2048, tool_choice="note")
    spec = OutputSpec("Answer", {"type": "object", "properties": {"n": {"type": "integer"}}})
    body = gemini_request("m", ModelRequest([_user("go")], [NOTE], settings=settings, output=spec))
    config = body["config"]
    assert (config.thinking_config.thinking_budget, config.thinking_config.include_thoughts) == (2048, True)
    calling = config.tool_config.function_calling_config
    assert (calling.mode.value, calling.allowed_function_names) == ("ANY", ["note"])
    assert (config.response_mime_type, config.response_json_schema) == ("application/json", spec.schema)
    assert config.automatic_function_calling.disable is True


async def test_an_error_chunk_inside_the_200_stream_is_typed_by_its_code() -> None:
    error = 'data: {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}\r\n\r\n'
    async with FakeProvider(lambda _: Sse([*gemini_frames("par")[:1], error]), base_path="") as fake:
        with pytest.raises(ProviderUnavailableError) as caught:
            await complete(_model(fake), ModelRequest([_user("go")]))
    assert caught.value.status == 503


async def test_bad_turns_through_the_loop_are_results_or_marked_replies_and_the_worker_serves_on(
    runtime: Any, start_worker: Any
) -> None:
    """A call with non-finite arguments is answered with an error the model sees; a safety block ends the
    message marked ``blocked``; the same agent then answers the next message."""
    from plexus.core import AgentId
    from plexus.llm import FINISH_KEY, tool
    from plexus.runtime import App

    @tool
    def note(text: str) -> str:
        """Write a note."""
        return f"noted {text}"

    def respond(body: dict[str, Any]) -> Answer:
        last = body["contents"][-1]["parts"][0]
        if last.get("text") == "unsafe":
            return Sse(gemini_frames("", finish="SAFETY"))
        if "functionResponse" in last:
            return Sse(gemini_frames("recovered"))
        return Sse(gemini_frames("", [GeminiCall("note", {"text": float("nan")})]))

    async with FakeProvider(respond, base_path="") as fake:
        app = App()
        app.register("noter", lambda _id: LLMAgent(_model(fake), tools=[note]))
        await start_worker(app)
        agent = AgentId("noter", "b1")
        reply = await runtime.send_message([TextBlock(text="note NaN")], agent, timeout=30)
        blocked = await runtime.send_message([TextBlock(text="unsafe")], agent, timeout=30)
        again = await runtime.send_message([TextBlock(text="note NaN")], agent, timeout=30)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["recovered"]
    error = fake.requests[1]["contents"][-1]["parts"][0]["functionResponse"]["response"]
    assert list(error) == ["error"]
    assert all(b.metadata.get(FINISH_KEY) == "blocked" for b in blocked)
    assert [b.text for b in again if isinstance(b, TextBlock)] == ["recovered"]
