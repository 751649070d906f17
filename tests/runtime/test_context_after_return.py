"""A task a handler leaves behind acts no more once the handler returned: every `Context` effect raises, so
it can neither act outside its message's handling nor slip past the lease gate (which knows only running
handlers)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from plexus.core import AgentId, BaseBlock, TextBlock, TopicId, Usage
from plexus.runtime import Agent, App, Context, Runtime

from .conftest import StartWorker

EFFECTS = ("send", "publish", "stream", "usage", "emit_progress", "spawn", "checkpoint")


class Leaver(Agent):
    """Starts a task that waits until the handler has returned, then tries every effect of its Context."""

    outcomes: dict[str, str] = {}  # noqa: RUF012 - shared with the test (one worker in this process)
    done = asyncio.Event()

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        returned = asyncio.Event()

        async def later() -> None:
            await returned.wait()
            await asyncio.sleep(0.2)  # the worker unbinds the Context after the handler returns
            calls: dict[str, Callable[[], Awaitable[object]]] = {
                "send": lambda: ctx.send([TextBlock(text="late")], AgentId("sink", "k"), timeout=2),
                "publish": lambda: ctx.publish([TextBlock(text="late")], TopicId("late", "x")),
                "stream": lambda: ctx.stream("late"),
                "usage": lambda: ctx.usage(Usage(input_tokens=1)),
                "emit_progress": lambda: ctx.emit_progress("thinking"),
                "spawn": lambda: ctx.spawn(AgentId("sink", "child"), [TextBlock(text="late")], timeout=2),
                "checkpoint": lambda: ctx.checkpoint(),
            }
            for name, call in calls.items():
                try:
                    await call()
                    Leaver.outcomes[name] = "acted"
                except RuntimeError as exc:
                    Leaver.outcomes[name] = str(exc)
                except Exception as exc:
                    Leaver.outcomes[name] = repr(exc)
            Leaver.done.set()

        self.task = asyncio.ensure_future(later())  # kept alive by the agent
        asyncio.get_running_loop().call_soon(returned.set)
        return [TextBlock(text="bye")]


class Sink(Agent):
    received: list[str] = []  # noqa: RUF012

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        Sink.received.append(str(ctx.agent_id))
        return blocks


async def _answer(runtime: Runtime, start_worker: StartWorker, agent: Agent) -> list[BaseBlock]:
    """Serve ``agent`` (as type "agent") next to a `Sink`, and send it one message: its answer."""
    app = App()
    app.register("agent", lambda _id: agent)
    app.register("sink", lambda _id: Sink())
    await start_worker(app)
    return await runtime.send_message([TextBlock(text="go")], AgentId("agent", "k"), timeout=20)


async def test_a_task_outliving_its_handler_gets_no_effect_through_its_context(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    Leaver.outcomes.clear()
    Leaver.done = asyncio.Event()
    Sink.received.clear()
    assert await _answer(runtime, start_worker, Leaver()) == [TextBlock(text="bye")]
    await asyncio.wait_for(Leaver.done.wait(), 10)
    assert set(Leaver.outcomes) == set(EFFECTS)
    for name, outcome in Leaver.outcomes.items():
        assert "no longer active" in outcome, (name, outcome)
    await asyncio.sleep(0.3)
    assert Sink.received == []


@pytest.mark.parametrize("effect", ["send", "stream"])
async def test_effects_inside_the_handler_still_work(
    runtime: Runtime, start_worker: StartWorker, effect: str
) -> None:
    """(The check costs the running handler nothing it could notice.)"""
    Sink.received.clear()

    class Active(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            if effect == "send":
                await ctx.send([TextBlock(text="now")], AgentId("sink", "k2"), timeout=10)
            else:
                await ctx.stream("now")
            return [TextBlock(text="ok")]

    assert await _answer(runtime, start_worker, Active()) == [TextBlock(text="ok")]
    assert Sink.received == (["sink/k2"] if effect == "send" else [])
