"""★ Journaled turns: a worker SIGKILLed between turn 2 and turn 3 of a 4-turn run; the retried handler on
another worker replays turns 1-2 from the journal, so the provider is asked for them exactly once. Two more
kill points: while a tool runs (its step runs again, nothing before it), and after the final turn is stored
but before the message is committed (nothing runs again: the whole run comes from the journal)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from plexus.core import AgentId, BaseBlock, ExecutionBudget, TextBlock
from plexus.llm import LlmStep
from plexus.runtime import Runtime

from .fake_providers import Answer, FakeProvider, Sse, openai_frames


def _turn_of(body: dict[str, Any]) -> int:
    """Which turn a request is for: one more than the assistant messages it carries."""
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


async def _hosted(runtime: Runtime) -> None:
    """Until the worker just started hosts the agent (a type the registry never saw is refused at once)."""
    await runtime.get("researcher", lazy=False, timeout=60)


async def _kill(worker: Any) -> None:
    os.kill(worker.pid, signal.SIGKILL)
    assert await asyncio.to_thread(worker.wait, 10) == -signal.SIGKILL


async def test_sigkill_between_turn_2_and_3_never_re_requests_turns_1_and_2(
    runtime: Runtime, worker_process: Any, tmp_path: Path
) -> None:
    per_turn: Counter[int] = Counter()

    async with FakeProvider(_four_turns(per_turn)) as fake:
        notes = tmp_path / "notes.log"
        env = {"FAKE_OPENAI_URL": fake.base_url, "NOTE_LOG": str(notes)}
        arrived, release = fake.hold(3)  # turn 3's first request waits: the worker is mid-run, turns 1-2 done
        first = worker_process("tests.llm.apps_llm:app", "--worker-id", "w1", env=env)
        await _hosted(runtime)
        reply_task = asyncio.ensure_future(
            runtime.send_message([TextBlock(text="research nats")], AgentId("researcher", "r1"), timeout=90)
        )
        await asyncio.wait_for(arrived.wait(), 60)
        await _kill(first)
        release.set()
        worker_process("tests.llm.apps_llm:app", "--worker-id", "w2", env=env)
        reply = await asyncio.wait_for(reply_task, 90)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 4 turns"]
    # The request counter: turns 1 and 2 were paid once; turn 3 twice (its first call died with the worker).
    assert per_turn == Counter({1: 1, 2: 1, 3: 2, 4: 1}), (per_turn, _logs(tmp_path))
    assert fake.count == 5
    # Tool results come from the journal too: each tool ran exactly once, none again after the crash.
    assert notes.read_text().split() == ["t1", "t2", "t3"]
    # The replayed transcript is the original one: turn 3's retry carried turns 1-2 and their tool results.
    retry = fake.requests[3]
    tool_messages = [m for m in retry["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_1", "call_2"]
    assert tool_messages[0]["content"] == "noted: t1"


async def test_an_orchestrated_run_killed_mid_run_counts_every_answered_call_once(
    runtime: Runtime, worker_process: Any, orchestrator: Any, tmp_path: Path
) -> None:
    """The tree's budget after a crash counts what the provider billed: every call that answered, once. The
    replayed turns were counted before they were journaled and are not counted again; the call that died
    with the worker never answered (no usage), and its retry is counted."""
    per_turn: Counter[int] = Counter()

    async with FakeProvider(_four_turns(per_turn)) as fake:
        env = {"FAKE_OPENAI_URL": fake.base_url, "NOTE_LOG": str(tmp_path / "notes.log")}
        arrived, release = fake.hold(3)
        first = worker_process("tests.llm.apps_llm:app", "--worker-id", "w1", env=env)
        await _hosted(runtime)
        run_id = await runtime.start_run(
            AgentId("researcher", "o1"),
            [TextBlock(text="research nats")],
            budget=ExecutionBudget(max_tokens=10_000),
        )
        await asyncio.wait_for(arrived.wait(), 60)
        await _kill(first)
        release.set()
        worker_process("tests.llm.apps_llm:app", "--worker-id", "w2", env=env)
        reply = await runtime.run_result(run_id, timeout=90)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 4 turns"]
    assert per_turn == Counter({1: 1, 2: 1, 3: 2, 4: 1}), (per_turn, _logs(tmp_path))
    record = await runtime.get_run(run_id)
    # 4 answered calls of 12 + 7 tokens each (openai_frames' usage); the 5th request died unanswered.
    assert (record.usage.tokens, record.usage.turns) == (4 * 19, 4), record.usage


def _two_turns(per_turn: Counter[int]) -> Any:
    """Turn 1 asks for the ``note`` tool, turn 2 answers."""

    def respond(body: dict[str, Any]) -> Answer:
        turn = _turn_of(body)
        per_turn[turn] += 1
        if turn == 1:
            return Sse(openai_frames("noting", [("call_1", "note", '{"text": "t1"}')]))
        return Sse(openai_frames("done after 2 turns"))

    return respond


async def _journal_steps(runtime: Runtime, key: str) -> list[int]:
    records = await runtime.event_log(AgentId("researcher.llm-journal", key)).read()
    return [r.entry.step for r in records if isinstance(r.entry, LlmStep)]


async def _parked_at(marker: Path) -> None:
    """Wait until the worker parks at ``marker``."""
    for _ in range(600):
        if await asyncio.to_thread(marker.exists):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the worker never reached {marker.name}")


async def _two_turns_killed(
    runtime: Runtime,
    worker_process: Any,
    tmp_path: Path,
    key: str,
    hold: dict[str, str],
    parked: Callable[[], Awaitable[None]],
) -> tuple[list[BaseBlock], Counter[int], int]:
    """A two-turn run to ``key`` on a worker started with ``hold``, SIGKILLed once ``parked()`` returns, then
    finished by a second worker: the reply, the provider's requests per turn and in all."""
    per_turn: Counter[int] = Counter()
    async with FakeProvider(_two_turns(per_turn)) as fake:
        env = {"FAKE_OPENAI_URL": fake.base_url, "NOTE_LOG": str(tmp_path / "notes.log")}
        first = worker_process("tests.llm.apps_llm:app", "--worker-id", "w1", env={**env, **hold})
        await _hosted(runtime)
        reply_task = asyncio.ensure_future(
            runtime.send_message([TextBlock(text="note it")], AgentId("researcher", key), timeout=90)
        )
        await parked()
        await _kill(first)
        worker_process("tests.llm.apps_llm:app", "--worker-id", "w2", env=env)
        reply = await asyncio.wait_for(reply_task, 90)
    return reply, per_turn, fake.count


async def test_sigkill_while_a_tool_runs_repeats_only_the_tool_step(
    runtime: Runtime, worker_process: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "in-tool"
    reply, per_turn, _ = await _two_turns_killed(
        runtime, worker_process, tmp_path, "t1", {"NOTE_HOLD": str(marker)}, lambda: _parked_at(marker)
    )
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 2 turns"]
    # Turn 1 came from the journal; the tool, killed mid-run, ran again (tools run at least once).
    assert per_turn == Counter({1: 1, 2: 1}), (per_turn, _logs(tmp_path))
    assert (tmp_path / "notes.log").read_text().split() == ["t1", "t1"]
    assert await _journal_steps(runtime, "t1") == [0, 1, 2]  # each step stored once


async def test_sigkill_after_the_final_turn_is_stored_runs_nothing_again(
    runtime: Runtime, worker_process: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "after-final-turn"

    async def final_turn_stored() -> None:
        # The worker parks after the loop's last iteration, before the commit; the final turn's append is
        # then on its way: wait until the journal holds it.
        await _parked_at(marker)
        for _ in range(600):
            if await _journal_steps(runtime, "f1") == [0, 1, 2]:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the final turn was never stored: {_logs(tmp_path)}")

    hold = {"HOLD_AFTER_TURN": f"1:{marker}"}
    reply, per_turn, requests = await _two_turns_killed(
        runtime, worker_process, tmp_path, "f1", hold, final_turn_stored
    )
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 2 turns"]
    assert per_turn == Counter({1: 1, 2: 1}), (per_turn, _logs(tmp_path))
    assert requests == 2  # the retried handler asked the provider for nothing
    assert (tmp_path / "notes.log").read_text().split() == ["t1"]
    assert await _journal_steps(runtime, "f1") == [0, 1, 2]


def _logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(tmp_path.glob("worker*.log")))
