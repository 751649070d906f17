"""★ Forks: a 4-turn run of a real `plexus worker` process against the fake OpenAI server is forked at turn 2
with an edited message. The fork's first request holds the transcript up to turn 2 plus the edit, turns
1-2 are never requested again, the source run's records are byte-identical before and after, and a worker
SIGKILLed during the forked run loses nothing. Bad points and edits are typed errors."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from plexus.core import AgentId, BaseBlock, TextBlock, ToolResultBlock, entry_to_json
from plexus.llm import LLMAgent, ModelRequest, ScriptedModel, ScriptedTurn, tool
from plexus.runtime import (
    Agent,
    App,
    Context,
    ForkEdit,
    ForkPoint,
    ForkPointNotFoundError,
    InvalidForkError,
    Runtime,
)
from plexus.runtime.kernel import checkpoint_key, escape_token
from plexus.runtime.orchestration import RunNotFoundError, input_key, run_key, tree_key

from .fake_providers import Answer, FakeProvider, Sse, openai_frames

_APP = "tests.llm.apps_llm:app"


def _turn_of(body: dict[str, Any]) -> int:
    return 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")


def _four_turns(per_turn: Counter[int]) -> Any:
    """Turns 1-3 each ask for the ``note`` tool, turn 4 answers."""

    def respond(body: dict[str, Any]) -> Answer:
        turn = _turn_of(body)
        per_turn[turn] += 1
        if turn < 4:
            return Sse(openai_frames(f"step {turn}", [(f"call_{turn}", "note", f'{{"text": "t{turn}"}}')]))
        return Sse(openai_frames("done after 4 turns"))

    return respond


async def _records(rt: Runtime, run_id: str, key: str) -> list[Any]:
    """Everything stored about the source run and its agent, as stored."""
    conn = rt.connection
    names = conn.topology.names
    out: list[Any] = []
    for bucket, kv_key in (
        (names.runs_bucket, run_key(escape_token(run_id))),
        (names.runs_bucket, input_key(escape_token(run_id))),
        (names.runs_bucket, tree_key(escape_token(run_id))),
        (names.checkpoints_bucket, checkpoint_key("default", "researcher", key)),
    ):
        entry = await conn.gets.kv_entry(bucket, kv_key)
        out.append(None if entry is None else (entry.seq, entry.data))
    for agent in (AgentId("researcher", key), AgentId("researcher.llm-journal", key)):
        log = rt.event_log(agent)
        out.append(await log.last_seq())
        out.append([(r.seq, r.index, entry_to_json(r.entry)) for r in await log.read()])
    return out


async def _source_run(rt: Runtime, key: str) -> str:
    """A 4-turn run, ended and settled (its tree's slot released: the orchestrator writes nothing more)."""
    await rt.get("researcher", lazy=False, timeout=60)
    run_id = await rt.start_run(AgentId("researcher", key), [TextBlock(text="research nats")])
    reply = await rt.run_result(run_id, timeout=90)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 4 turns"]
    bucket, tree = rt.connection.topology.names.runs_bucket, tree_key(escape_token(run_id))
    for _ in range(600):
        entry = await rt.connection.gets.kv_entry(bucket, tree)
        if entry is not None and entry.data and b'"active"' not in entry.data:
            return run_id
        await asyncio.sleep(0.05)
    raise AssertionError("the source run's tree never settled")


async def test_a_fork_at_turn_2_with_an_edit_asks_only_for_what_follows_and_leaves_the_source_as_it_was(
    runtime: Runtime, worker_process: Any, orchestrator: Any, tmp_path: Path
) -> None:
    per_turn: Counter[int] = Counter()
    async with FakeProvider(_four_turns(per_turn)) as fake:
        env = {"FAKE_OPENAI_URL": fake.base_url, "NOTE_LOG": str(tmp_path / "notes.log")}
        worker_process(_APP, env=env)
        run_id = await _source_run(runtime, "src")
        assert fake.count == 4
        before = await _records(runtime, run_id, "src")

        fork_id = await runtime.fork_run(run_id, at=2, edit="focus on jetstream")
        reply = await runtime.run_result(fork_id, timeout=90)

        assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 4 turns"]
        # Turns 1-2 were requested once, by the source; the fork asked for turn 3 (with the edit) and 4.
        assert per_turn == Counter({1: 1, 2: 1, 3: 2, 4: 2}), per_turn
        first = fake.requests[4]
        # The fork's first request: exactly what the source sent for turn 3 (system, user, turns 1-2 and
        # their tool results), then the edited message.
        assert first["messages"][:-1] == fake.requests[2]["messages"]
        edit = first["messages"][-1]
        assert edit["role"] == "user"
        assert "focus on jetstream" in str(edit["content"])
        assert await _records(runtime, run_id, "src") == before

        record = await runtime.get_run(fork_id)
        assert record.forked_from == {
            "run_id": run_id,
            "agent_id": "researcher/src",
            "message": 0,
            "turn": 2,
        }
        assert record.agent_id.startswith("researcher/src.fork-")
        assert record.usage.turns == 2  # its own budget's counters: the fork's two calls only

        # Turn 0 is the message itself: its user item replaced, the system prompt and settings edited.
        fork0 = await runtime.fork_run(
            run_id,
            at=ForkPoint(turn=0),
            edit=ForkEdit(message="research kafka", system="Be terse.", settings={"temperature": 0.25}),
        )
        await runtime.run_result(fork0, timeout=90)
        again = fake.requests[6]
        assert again["messages"][0] == {"role": "system", "content": "Be terse."}
        assert [m["role"] for m in again["messages"]] == ["system", "user"]
        assert "research kafka" in str(again["messages"][1]["content"])
        assert again["temperature"] == 0.25
        assert await _records(runtime, run_id, "src") == before


async def test_bad_fork_points_and_edits_are_typed_errors_and_change_nothing(
    runtime: Runtime, worker_process: Any, orchestrator: Any, tmp_path: Path
) -> None:
    per_turn: Counter[int] = Counter()
    async with FakeProvider(_four_turns(per_turn)) as fake:
        worker_process(_APP, env={"FAKE_OPENAI_URL": fake.base_url})
        run_id = await _source_run(runtime, "bad")
        before = await _records(runtime, run_id, "bad")

        with pytest.raises(RunNotFoundError):
            await runtime.fork_run("run_01J0000000000000000000NOPE", at=1)
        with pytest.raises(ForkPointNotFoundError, match="4 journaled turn"):
            await runtime.fork_run(run_id, at=9)
        with pytest.raises(ForkPointNotFoundError, match="handled 1 message"):
            await runtime.fork_run(run_id, at=ForkPoint(message=3))
        with pytest.raises(ForkPointNotFoundError, match="no run of the tree"):
            await runtime.fork_run(run_id, at=ForkPoint(agent="researcher/other", turn=1))
        with pytest.raises(InvalidForkError, match="settings"):
            await runtime.fork_run(run_id, at=1, edit=ForkEdit(settings={"temperature": "hot"}))
        with pytest.raises(ValidationError):
            ForkEdit.model_validate({"message": [{"type": "text"}]})  # a block without its text
        with pytest.raises(ValidationError):
            ForkEdit.model_validate({"message": []})

        assert await _records(runtime, run_id, "bad") == before
        assert fake.count == 4  # nothing was asked of the provider


async def test_a_worker_killed_during_a_forked_run_loses_nothing(
    runtime: Runtime, worker_process: Any, orchestrator: Any, tmp_path: Path
) -> None:
    per_turn: Counter[int] = Counter()
    notes = tmp_path / "notes.log"
    async with FakeProvider(_four_turns(per_turn)) as fake:
        env = {"FAKE_OPENAI_URL": fake.base_url, "NOTE_LOG": str(notes)}
        first = worker_process(_APP, "--worker-id", "w1", env=env)
        run_id = await _source_run(runtime, "kill")
        # The fork asks for turn 3 (request 5), runs its tool, then turn 4 (request 6) waits: kill there.
        arrived, release = fake.hold(6)
        fork_id = await runtime.fork_run(run_id, at=2, edit="focus on jetstream")
        await asyncio.wait_for(arrived.wait(), 60)
        os.kill(first.pid, signal.SIGKILL)
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
        release.set()
        worker_process(_APP, "--worker-id", "w2", env=env)
        reply = await runtime.run_result(fork_id, timeout=90)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 4 turns"]
    # The fork's turn 3 and its tool came from its journal after the crash; only turn 4 was asked again.
    assert per_turn == Counter({1: 1, 2: 1, 3: 2, 4: 3}), per_turn
    assert notes.read_text().split() == ["t1", "t2", "t3", "t3"]
    record = await runtime.get_run(fork_id)
    assert record.usage.turns == 2, record.usage  # the fork's two answered calls, each counted once


@tool
async def ask_expert(question: str, ctx: Context) -> str:
    """Ask the expert sub-agent (a child run of the tree)."""
    reply = await ctx.spawn(AgentId("expert", "e1"), [TextBlock(text=question)], timeout=30)
    return " ".join(b.text for b in reply if isinstance(b, TextBlock))


def _lead_turn(request: ModelRequest) -> ScriptedTurn:
    """Ask the expert first; answer once its result is in the conversation."""
    answered = any(isinstance(b, ToolResultBlock) for i in request.items for b in i.blocks)
    if answered:
        return ScriptedTurn(text="done")
    return ScriptedTurn(tool_calls=[("c1", "ask_expert", {"question": "why?"})])


class _Expert(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return [TextBlock(text="because")]


async def test_a_point_inside_a_child_forks_from_the_parents_matching_point(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    lead = ScriptedModel([_lead_turn] * 8)
    app = App()
    app.register("lead", lambda _id: LLMAgent(lead, tools=[ask_expert]))
    app.register("expert", lambda _id: _Expert())
    await start_worker(app)
    run_id = await runtime.start_run(AgentId("lead", "p1"), [TextBlock(text="?")])
    assert [b.text for b in await runtime.run_result(run_id, timeout=60) if isinstance(b, TextBlock)] == [
        "done"
    ]
    [child] = (await runtime.get_run(run_id)).children
    assert (await runtime.get_run(child)).agent_id == "expert/e1"

    # The expert's conversation exists because the lead asked: the fork starts from the lead's message, at
    # its last turn before the turn whose tool step spawned the expert (here: the message itself).
    fork_id = await runtime.fork_run(run_id, at=ForkPoint(agent="expert/e1"))
    reply = await runtime.run_result(fork_id, timeout=60)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done"]
    record = await runtime.get_run(fork_id)
    assert record.forked_from == {"run_id": run_id, "agent_id": "lead/p1", "message": 0, "turn": 0}
    assert len(record.children) == 1  # the expert was spawned again, in the new tree
    assert len(lead.requests) == 4  # the source's two turns, the fork's two: nothing was skipped or doubled


class _Counter(Agent):
    """Counts its messages in its state and answers the count with the message's text."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        said = " ".join(b.text for b in blocks if isinstance(b, TextBlock))
        return [TextBlock(text=f"{self.state['n']}: {said}")]


async def test_any_agent_forks_at_a_handled_message_from_its_state_before_it(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    app = App()
    app.register("counter", lambda _id: _Counter())
    await start_worker(app)
    runs = []
    for word in ("one", "two", "three"):
        run_id = await runtime.start_run(AgentId("counter", "c"), [TextBlock(text=word)])
        await runtime.run_result(run_id, timeout=60)
        runs.append(run_id)

    # The state before run 3's message was {"n": 2}: the fork handles run 3's input again from there.
    fork_id = await runtime.fork_run(runs[2], at=ForkPoint())
    assert [b.text for b in await runtime.run_result(fork_id, timeout=60) if isinstance(b, TextBlock)] == [
        "3: three"
    ]
    edited = await runtime.fork_run(runs[1], at=ForkPoint(), edit="deux")
    assert [b.text for b in await runtime.run_result(edited, timeout=60) if isinstance(b, TextBlock)] == [
        "2: deux"
    ]
    with pytest.raises(ForkPointNotFoundError, match="no fork hook knows turns"):
        await runtime.fork_run(runs[0], at=1)
    with pytest.raises(InvalidForkError, match="system/settings"):
        await runtime.fork_run(runs[0], at=ForkPoint(), edit=ForkEdit(system="new"))
