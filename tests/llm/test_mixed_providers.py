"""A transcript continued on another provider (a handoff, a fork with another model, a switched model): each
adapter sends back only its own provider's reasoning, the visible text stays. Every turn goes through the
official SDKs against the fake providers on loopback, and the assertions read the bodies they received."""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import openai

from plexus.core import (
    AgentId,
    Item,
    ItemKind,
    TextBlock,
    ThinkingBlock,
    content_block_from_dict,
    content_block_to_dict,
)
from plexus.llm import (
    AnthropicModel,
    GeminiModel,
    LLMAgent,
    ModelClient,
    ModelRequest,
    OpenAIResponsesModel,
    complete,
)
from plexus.runtime import App, Runtime

from .fake_gemini import GeminiCall, gemini_client, gemini_frames
from .fake_providers import FakeProvider, Sse, anthropic_frames
from .fake_responses import Reasoning, responses_frames

GEMINI_SIGNATURE = b"gemini-thought-signature-bytes"
ANTHROPIC_SIGNATURE = base64.b64encode(b"anthropic-signature").decode()  # base64, as Anthropic's are


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


def _anthropic(fake: FakeProvider) -> AnthropicModel:
    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test-key", max_retries=0)
    return AnthropicModel(client, "fake-claude")


def _responses(fake: FakeProvider) -> OpenAIResponsesModel:
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test-key", max_retries=0)
    return OpenAIResponsesModel(client, "fake-model")


def _gemini(fake: FakeProvider) -> GeminiModel:
    return GeminiModel(gemini_client(fake), "fake-gemini")


def _journaled(item: Item) -> Item:
    """``item`` as a journal or a handoff carries it: through its JSON and back."""
    blocks = [content_block_from_dict(json.loads(json.dumps(content_block_to_dict(b)))) for b in item.blocks]
    return Item(kind=item.kind, blocks=blocks)


async def _continue_on_anthropic(first: Item) -> dict[str, Any]:
    items = [_user("hi"), _journaled(first), _user("and then?")]
    async with FakeProvider(lambda _: Sse(anthropic_frames("carried on")), base_path="") as fake:
        turn = await complete(_anthropic(fake), ModelRequest(items=items))
    assert [b for b in turn.item.blocks if isinstance(b, TextBlock)] == [TextBlock(text="carried on")]
    return fake.requests[0]


async def _first_turn(frames: list[str], model: Any) -> Item:
    async with FakeProvider(lambda _: Sse(frames), base_path="") as fake:
        client: ModelClient = model(fake)
        turn = await complete(client, ModelRequest(items=[_user("hi")]))
    assert any(isinstance(b, ThinkingBlock) and b.signature for b in turn.item.blocks)
    return turn.item


def _assistant_content(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for m in body["messages"] if m["role"] == "assistant" for c in m["content"]]


async def test_gemini_reasoning_is_not_sent_to_anthropic() -> None:
    frames = gemini_frames("four", thought="thinking it over", text_signature=GEMINI_SIGNATURE)
    first = await _first_turn(frames, _gemini)
    body = await _continue_on_anthropic(first)
    content = _assistant_content(body)
    assert content == [{"type": "text", "text": "four"}]  # the visible answer stays, the reasoning goes
    assert base64.b64encode(GEMINI_SIGNATURE).decode() not in json.dumps(body)


async def test_responses_reasoning_is_not_sent_to_anthropic() -> None:
    reasoning = Reasoning(summary=["weighing it"], encrypted="enc-opaque-blob")
    first = await _first_turn(responses_frames("four", reasoning=reasoning), _responses)
    body = await _continue_on_anthropic(first)
    assert _assistant_content(body) == [{"type": "text", "text": "four"}]
    assert "enc-opaque-blob" not in json.dumps(body)


def _redacted_anthropic_frames(text: str, data: str) -> list[str]:
    """An answer whose reasoning Anthropic withheld (a ``redacted_thinking`` block of ``data``), then text."""
    frames = anthropic_frames(text, thinking=("", ""))
    start = '"content_block": {"type": "thinking", "thinking": "", "signature": ""}'
    redacted = f'"content_block": {{"type": "redacted_thinking", "data": "{data}"}}'
    return [f.replace(start, redacted) for f in frames if "signature_delta" not in f]


async def test_anthropic_reasoning_is_not_sent_to_gemini() -> None:
    thinking = await _first_turn(
        anthropic_frames("four", thinking=("let me think", ANTHROPIC_SIGNATURE)), _anthropic
    )
    redacted = await _first_turn(_redacted_anthropic_frames("five", ANTHROPIC_SIGNATURE), _anthropic)
    assert any(isinstance(b, ThinkingBlock) and b.redacted for b in redacted.blocks)
    items = [_user("hi"), _journaled(thinking), _user("more"), _journaled(redacted), _user("and then?")]
    async with FakeProvider(lambda _: Sse(gemini_frames("carried on")), base_path="") as fake:
        turn = await complete(_gemini(fake), ModelRequest(items=items))
    assert turn.item.blocks == [TextBlock(text="carried on")]
    model_parts = [p for c in fake.requests[0]["contents"] if c["role"] == "model" for p in c["parts"]]
    assert model_parts == [{"text": "four"}, {"text": "five"}]  # no thought, no thoughtSignature


async def test_anthropic_reasoning_is_not_sent_to_responses() -> None:
    frames = anthropic_frames("four", thinking=("let me think", ANTHROPIC_SIGNATURE))
    first = await _first_turn(frames, _anthropic)
    items = [_user("hi"), _journaled(first), _user("and then?")]
    async with FakeProvider(lambda _: Sse(responses_frames("carried on")), base_path="") as fake:
        await complete(_responses(fake), ModelRequest(items=items))
    body = fake.requests[0]
    assert all(i.get("type") != "reasoning" for i in body["input"])
    assert ANTHROPIC_SIGNATURE not in json.dumps(body)


async def test_own_reasoning_still_goes_back_after_a_journal_round_trip() -> None:
    frames = anthropic_frames("four", thinking=("let me think", ANTHROPIC_SIGNATURE))
    first = await _first_turn(frames, _anthropic)
    body = await _continue_on_anthropic(first)
    assert _assistant_content(body) == [
        {"type": "thinking", "thinking": "let me think", "signature": ANTHROPIC_SIGNATURE},
        {"type": "text", "text": "four"},
    ]


async def test_a_handoff_from_gemini_to_an_anthropic_specialist_sends_no_gemini_reasoning(
    runtime: Runtime, start_worker: Any
) -> None:
    """As a user meets it: a triage agent on Gemini thinks, signs its call and hands the conversation to a
    specialist on Anthropic; the specialist's request carries the triage's words but none of its reasoning."""
    call = GeminiCall("transfer_to_billing", {}, signature=GEMINI_SIGNATURE)
    triage_frames = gemini_frames("Routing.", [call], thought="billing, clearly")
    async with (
        FakeProvider(lambda _: Sse(triage_frames), base_path="") as gemini_fake,
        FakeProvider(lambda _: Sse(anthropic_frames("Billing here.")), base_path="") as anthropic_fake,
    ):
        app = App()
        billing = app.register("billing", lambda _id: LLMAgent(_anthropic(anthropic_fake)))
        app.register("triage", lambda _id: LLMAgent(_gemini(gemini_fake), handoffs=[billing]))
        await start_worker(app)
        reply = await runtime.send_message([TextBlock(text="refund?")], AgentId("triage", "t1"), timeout=30)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["Billing here."]
    (body,) = anthropic_fake.requests
    content = _assistant_content(body)
    assert {"type": "text", "text": "Routing."} in content
    assert all(c["type"] not in ("thinking", "redacted_thinking") for c in content)
    assert base64.b64encode(GEMINI_SIGNATURE).decode() not in json.dumps(body)
