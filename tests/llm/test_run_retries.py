"""Issue 36 item 9: a provider's recoverable error is retried by the run's RetryPolicy once `ProviderRetry`
(on by default in `LLMAgent`) gives up, replaying the completed turns from the journal; typed outcomes are
never retried; the SDK's own retries are off so they do not stack under Plexus's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from plexus.core import (
    AgentCrashError,
    AgentId,
    AgentNotFoundError,
    BudgetExhaustedError,
    CancellationError,
    ConcurrentAppendError,
    KernelError,
    MiddlewareTermination,
    RetryPolicy,
    SpawnDenied,
    TextBlock,
)
from plexus.llm import (
    AnthropicModel,
    AuthenticationError,
    LLMAgent,
    ModelRequest,
    OpenAIChatModel,
    ProviderProtocolError,
    ProviderRetry,
    ProviderUnavailableError,
    RateLimitError,
    complete,
    tool,
)
from plexus.runtime import App, Runtime
from plexus.runtime.orchestration import RunStatus
from plexus.runtime.worker.pipeline._retry import retryable

from .fake_providers import Answer, FakeProvider, Sse, Status, openai_frames

SLOW_DOWN = Status(429, {"error": {"message": "slow down"}}, {"retry-after": "0"})
FAST_POLICY = RetryPolicy(max_retries=4, initial_backoff_s=0.05, max_backoff_s=0.05)


@tool
def note(text: str) -> str:
    """Write a note down."""
    NOTES.append(text)
    return f"noted: {text}"


NOTES: list[str] = []


def _turn_of(body: dict[str, Any]) -> int:
    return 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")


def _app(fake: FakeProvider, **agent: Any) -> App:
    # The SDK's default max_retries (2) on purpose: the adapter must turn it off.
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k")
    app = App()
    app.register("r", lambda _id: LLMAgent(OpenAIChatModel(client, "m"), tools=[note], **agent))
    return app


async def test_a_429_on_turn_2_is_retried_by_the_policy_and_turn_1_is_not_requested_again(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    """Turn 2 answers 429 three times: the default ProviderRetry's three calls all fail, the run's policy
    retries the handler, whose journal replays turn 1 (not requested again); turn 2's fourth call works."""
    per_turn: Counter[int] = Counter()
    NOTES.clear()

    def respond(body: dict[str, Any]) -> Answer:
        turn = _turn_of(body)
        per_turn[turn] += 1
        if turn == 1:
            return Sse(openai_frames("noting", [("call_1", "note", '{"text": "t1"}')]))
        return SLOW_DOWN if per_turn[2] <= 3 else Sse(openai_frames("done"))

    async with FakeProvider(respond) as fake:
        await start_worker(_app(fake))
        run_id = await runtime.start_run(AgentId("r", "p1"), [TextBlock(text="go")], retry=FAST_POLICY)
        reply = await runtime.run_result(run_id, timeout=30)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done"]
    assert per_turn == Counter({1: 1, 2: 4})  # turn 1 once: the retried handler replayed it
    assert NOTES == ["t1"]  # and its tool ran once
    record = await runtime.get_run(run_id)
    assert (record.status, record.attempts) == (RunStatus.COMPLETED, 2)


async def test_an_authentication_error_is_not_retried(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    async with FakeProvider(lambda _: Status(401, {"error": {"message": "bad key"}})) as fake:
        await start_worker(_app(fake))
        run_id = await runtime.start_run(AgentId("r", "p2"), [TextBlock(text="go")], retry=FAST_POLICY)
        with pytest.raises(AuthenticationError):
            await runtime.run_result(run_id, timeout=30)
    assert fake.count == 1  # neither ProviderRetry, the SDK nor the policy asked again
    record = await runtime.get_run(run_id)
    assert (record.status, record.attempts) == (RunStatus.FAILED, 1)


async def test_non_retryable_keeps_its_meaning_for_provider_errors(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    """A policy naming a provider error (or a base class of it) in non_retryable does not retry it."""
    policy = FAST_POLICY.model_copy(update={"non_retryable": FAST_POLICY.non_retryable | {"ProviderError"}})
    async with FakeProvider(lambda _: SLOW_DOWN) as fake:
        await start_worker(_app(fake, provider_retry=None))
        run_id = await runtime.start_run(AgentId("r", "p3"), [TextBlock(text="go")], retry=policy)
        with pytest.raises(RateLimitError):
            await runtime.run_result(run_id, timeout=30)
    assert fake.count == 1


async def test_the_anthropic_sdk_does_not_retry_under_plexus() -> None:
    """(The OpenAI adapter's: test_openai.py::test_the_sdks_own_retries_are_off.)"""
    body = {"type": "error", "error": {"type": "api_error", "message": "down"}}
    async with FakeProvider(lambda _: Status(500, body), base_path="") as fake:
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k")  # max_retries=2 by default
        with pytest.raises(ProviderUnavailableError):
            await complete(AnthropicModel(client, "m"), ModelRequest(items=[]))
    assert fake.count == 1


async def test_provider_retry_caps_the_providers_retry_after_by_max_s(
    runtime: Runtime, start_worker: Any
) -> None:
    answers: Iterator[Answer] = iter(
        [Status(429, {"error": {"message": "later"}}, {"retry-after": "600"}), Sse(openai_frames("ok"))]
    )
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async with FakeProvider(lambda _: next(answers)) as fake:
        await start_worker(_app(fake, provider_retry=ProviderRetry(max_s=2.0, sleep=record)))
        reply = await runtime.send_message([TextBlock(text="hi")], AgentId("r", "cap"), timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["ok"]
    assert waits == [2.0]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RateLimitError("429", "openai"), True),
        (ProviderUnavailableError("503", "openai", 503), True),
        (ProviderProtocolError("garbage", "openai", 200), True),
        (AuthenticationError("401", "openai", 401), False),
        (BudgetExhaustedError("tokens", 5, 4), False),
        (CancellationError("user"), False),
        (SpawnDenied("run", {"max_agents": 1}), False),
        (MiddlewareTermination("guardrail"), False),
        (AgentCrashError("run", "a/b"), False),  # a callee's crash retries are spent already
        (ConcurrentAppendError(3, 5), False),  # a fenced write: Fencing's, never retried in place
        (KernelError("plain"), False),
        # A registered type with no live worker may have one on the next attempt; a misspelt one never will.
        (AgentNotFoundError("a/b", registered=True), True),
        (AgentNotFoundError.unregistered("concierg/bob", "concierg", ["concierge"]), False),
    ],
)
def test_which_kernel_errors_the_policy_may_retry(error: KernelError, expected: bool) -> None:
    assert retryable(error) is expected
