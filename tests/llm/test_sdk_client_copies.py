"""The adapters turn the SDK's own retries off through one copy per client, not one per adapter: adapters are
built per activation, and each fresh copy cost its first model call a thread hop (the SDK probes the platform
in a worker thread on a client's first request) and ≈ 20 µs to make."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import anthropic
import openai
import pytest

from plexus.core import Item, ItemKind, TextBlock
from plexus.llm import (
    AnthropicModel,
    ModelClient,
    ModelRequest,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ProviderUnavailableError,
    complete,
)

from .fake_providers import FakeProvider, Sse, Status, openai_frames


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


class _OpenAI(openai.AsyncOpenAI):
    """The SDK's client, its copies recorded (weakly) in ``copies``."""

    copies: list[weakref.ref[Any]]

    def copy(self, **kwargs: Any) -> Any:
        made = super().copy(**kwargs)
        self.copies.append(weakref.ref(made))
        return made

    with_options = copy


class _Anthropic(anthropic.AsyncAnthropic):
    copies: list[weakref.ref[Any]]

    def copy(self, **kwargs: Any) -> Any:
        made = super().copy(**kwargs)
        self.copies.append(weakref.ref(made))
        return made

    with_options = copy


def _openai(base_url: str, **kwargs: Any) -> _OpenAI:
    client = _OpenAI(base_url=base_url, api_key="k", **kwargs)
    client.copies = []
    return client


async def test_adapters_over_one_client_share_one_copy_without_retries() -> None:
    """Adapters as a factory builds them, one per activation: one copy in all, and its retries are off (a 500
    is one request, for the first adapter and for the next)."""
    async with FakeProvider(lambda _: Status(500, {"error": {"message": "boom"}})) as fake:
        client = _openai(fake.base_url)  # the SDK's default retries (2)
        models: list[ModelClient] = [OpenAIChatModel(client, "m") for _ in range(3)]
        models.append(OpenAIResponsesModel(client, "m"))
        assert len(client.copies) == 1
        for model in models[:2]:
            with pytest.raises(ProviderUnavailableError):
                await complete(model, ModelRequest(items=[_user("hi")]))
    assert fake.count == 2


async def test_a_client_without_retries_is_used_as_it_is() -> None:
    async with FakeProvider(lambda _: Sse(openai_frames("hello"))) as fake:
        client = _openai(fake.base_url, max_retries=0)
        turn = await complete(OpenAIChatModel(client, "m"), ModelRequest(items=[_user("hi")]))
    assert turn.item.blocks == [TextBlock(text="hello")]
    assert client.copies == []


def test_anthropic_adapters_share_one_copy() -> None:
    client = _Anthropic(base_url="http://127.0.0.1:9", api_key="k")
    client.copies = []
    for _ in range(3):
        AnthropicModel(client, "claude")
    assert len(client.copies) == 1


def test_a_dropped_client_takes_its_copy_with_it() -> None:
    """The copies are kept per client while it lives, not for ever: a worker building clients per
    activation does not accumulate them."""
    client = _openai("http://127.0.0.1:9")
    OpenAIChatModel(client, "m")
    (copy,) = client.copies
    assert copy() is not None
    del client
    gc.collect()
    assert copy() is None
