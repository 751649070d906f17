"""`App.register` refuses, when it is called, a factory the worker could not call on the first activation
(the mistakes used to surface only when a message first reached a worker)."""

from __future__ import annotations

import pytest

from plexus.core import AgentId, BaseBlock
from plexus.runtime import Agent, App, Context


class Greeter(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return blocks


class Keyed(Agent):
    def __init__(self, agent_id: AgentId) -> None:
        super().__init__()
        self.key = agent_id.key


def test_an_agent_class_whose_constructor_takes_no_agent_id_is_refused() -> None:
    with pytest.raises(TypeError) as info:
        App().register("greeter", Greeter)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("agent type 'greeter': factory Greeter() cannot be called with the AgentId")
    assert message.endswith(
        "register `lambda _id: Greeter()` or decorate the class with @app.agent('greeter')"
    )


def test_an_agent_instance_is_refused() -> None:
    with pytest.raises(TypeError) as info:
        App().register("greeter", Greeter())  # type: ignore[arg-type]
    assert str(info.value) == (
        "agent type 'greeter': got an agent instance (Greeter); register a factory that makes one per key, "
        "e.g. `lambda _id: Greeter(...)`"
    )


def test_a_class_that_is_not_an_agent_is_refused() -> None:
    class NotAnAgent:
        def __init__(self, agent_id: AgentId) -> None:
            pass

    with pytest.raises(TypeError, match=r"factory .*NotAnAgent is a class that is not an Agent subclass"):
        App().register("x", NotAnAgent)  # type: ignore[arg-type]


def test_a_factory_without_the_agent_id_parameter_or_not_callable_is_refused() -> None:
    with pytest.raises(TypeError) as info:
        App().register("greeter", lambda: Greeter())  # type: ignore[arg-type,misc]
    assert str(info.value).startswith("agent type 'greeter': factory test_a_factory_without_the_agent_id")
    assert "<lambda>() cannot be called with the AgentId (too many positional arguments)" in str(info.value)
    assert "it is called with one argument, the key's AgentId" in str(info.value)
    with pytest.raises(TypeError, match="the factory must be callable with the AgentId, got str"):
        App().register("greeter", "examples.app:Greeter")  # type: ignore[arg-type]


def test_factories_the_worker_can_call_are_accepted() -> None:
    async def make(agent_id: AgentId, *, flavour: str = "plain") -> Agent:
        return Greeter()

    app = App()
    app.register("a", lambda _id: Greeter())
    app.register("b", Keyed)
    app.register("c", make)
    app.register("d", lambda *args: Greeter())

    @app.agent("e")
    class Decorated(Greeter):
        pass

    assert sorted(app.types) == ["a", "b", "c", "d", "e"]
