"""Passivated activations are collectable: once the worker's idle sweep drops them, nothing in the worker
(its tables, caches, mailboxes, recent replies) nor in plexus.llm (`ItemMemo`, `PrefixFold`, the kept
conversation) keeps an agent, its context, its state or its transcript's items alive; and the worker's
recent replies (`RecentReplies`) keep only their window's."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import weakref
from typing import Any

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.llm import LLMAgent, ModelRequest, ScriptedModel, ScriptedTurn
from plexus.runtime import Agent, App, Context, Runtime
from tests.runtime.conftest import StartWorker

#: Agents of each kind; enough that a per-key structure that keeps them shows in the count.
N = 40


class _State(dict[str, Any]):
    """A plain agent's state: a dict the worker checkpoints, weak-referenceable (a plain dict is not)."""


class _Watched:
    """Weak references to what one activation made, by kind."""

    def __init__(self) -> None:
        self.refs: dict[str, list[weakref.ref[Any]]] = {}

    def add(self, kind: str, obj: object) -> None:
        self.refs.setdefault(kind, []).append(weakref.ref(obj))

    def alive(self) -> dict[str, int]:
        return {kind: sum(r() is not None for r in refs) for kind, refs in self.refs.items()}


WATCHED = _Watched()


class Noter(Agent):
    def __init__(self) -> None:
        super().__init__()
        self.state = _State()
        WATCHED.add("agent", self)

    def load_state(self, state: Any) -> None:
        self.state = _State(state)

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        WATCHED.add("context", ctx)
        WATCHED.add("state", self.state)
        self.state["n"] = int(self.state.get("n", 0)) + 1
        return [TextBlock(text="x" * 500)]  # a reply the worker may keep (checkpoint, recent replies)


class WatchedLLMAgent(LLMAgent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        WATCHED.add("llm context", ctx)
        return await super().on_message(blocks, ctx)


def _answer(request: ModelRequest) -> ScriptedTurn:
    for item in request.items:
        WATCHED.add("item", item)
    return ScriptedTurn(text="y" * 500)


def _llm_agent(_id: AgentId) -> LLMAgent:
    # One model per agent: a ScriptedModel records its requests (and so their items) for the test's sake.
    agent = WatchedLLMAgent(ScriptedModel([_answer] * 2), system="be brief")
    WATCHED.add("llm agent", agent)
    return agent


async def test_passivated_activations_are_collected(runtime: Runtime, start_worker: StartWorker) -> None:
    app = App()
    app.register("noter", lambda _id: Noter())
    app.register("chat", _llm_agent)
    # A long idle timeout while the agents run (none passivated halfway); a short one is set below.
    worker = await start_worker(app, idle_passivate_s=3600.0)
    targets = [AgentId(kind, f"k{i}") for kind in ("noter", "chat") for i in range(N)]
    for _ in range(2):  # two messages each: the LLM agents keep a conversation between them
        await asyncio.gather(*(runtime.send_message([TextBlock(text="hi")], t, timeout=30) for t in targets))
    assert len(worker._activations) == 2 * N
    assert WATCHED.alive()["agent"] == N
    assert WATCHED.alive()["llm agent"] == N

    # The upkeep passivates (with its copy of the config): every activation is idle from now on.
    worker._upkeep.config = dataclasses.replace(worker._upkeep.config, idle_passivate_s=0.0)
    async with asyncio.timeout(20):
        # Passivation runs on the worker's maintenance timer (every heartbeat); there is no event to await.
        while len(worker._activations):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    gc.collect()
    alive = WATCHED.alive()
    assert set(alive) == {"agent", "context", "state", "llm agent", "llm context", "item"}
    assert alive == dict.fromkeys(alive, 0), f"still alive after passivation: {alive}"


async def _replies_of_a_burst(
    runtime: Runtime, start_worker: StartWorker, prefix: str
) -> tuple[Any, list[AgentId]]:
    """A worker whose re-send window is 0.5 s answers N new keys at once; its recent replies and the keys."""
    app = App()
    app.register("noter", lambda _id: Noter())
    worker = await start_worker(app)
    recent = worker._intake.recent_replies
    recent.WINDOW_S = 0.5  # this worker's only
    targets = [AgentId("noter", f"{prefix}{i}") for i in range(N)]
    await asyncio.gather(*(runtime.send_message([TextBlock(text="hi")], t, timeout=30) for t in targets))
    return recent, targets


async def test_the_worker_lets_go_of_replies_older_than_its_resend_window(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Replies are kept to be sent again after a reconnect, for `WINDOW_S`; they were kept until 8,192 newer
    ones pushed them out, so a worker held the last replies of agents passivated long ago."""
    recent, targets = await _replies_of_a_burst(runtime, start_worker, "r")
    assert recent._recent
    await asyncio.sleep(1.0)
    await runtime.send_message([TextBlock(text="hi")], targets[0], timeout=30)
    assert len(recent._recent) == 1


async def test_the_worker_lets_go_of_its_last_replies_when_no_newer_one_comes(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Older replies were let go only as a newer one was recorded: a worker that went idle after a burst
    kept the burst's last second of replies for good."""
    recent, _ = await _replies_of_a_burst(runtime, start_worker, "q")
    assert recent._recent  # kept (some may already be gone if the burst outlasted the window)
    async with asyncio.timeout(5):
        while recent._recent:  # noqa: ASYNC110 (let go by the worker's timer: nothing to await)
            await asyncio.sleep(0.05)
