"""★ Journaled turns: a worker SIGKILLed between turn 2 and turn 3 of a 4-turn run; the retried handler on
another worker replays turns 1-2 from the journal, so the provider is asked for them exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from plexus.core import AgentId, TextBlock
from plexus.runtime import Runtime

from .fake_providers import Answer, FakeProvider, Sse, openai_frames


def _turn_of(body: dict[str, Any]) -> int:
    """Which turn a request is for: one more than the assistant messages it carries."""
    return 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")


async def test_sigkill_between_turn_2_and_3_never_re_requests_turns_1_and_2(
    runtime: Runtime, worker_process: Any, tmp_path: Path
) -> None:
    per_turn: Counter[int] = Counter()

    def respond(body: dict[str, Any]) -> Answer:
        turn = _turn_of(body)
        per_turn[turn] += 1
        if turn < 4:
            return Sse(openai_frames(f"step {turn}", [(f"call_{turn}", "note", f'{{"text": "t{turn}"}}')]))
        return Sse(openai_frames("done after 4 turns"))

    async with FakeProvider(respond) as fake:
        notes = tmp_path / "notes.log"
        env = {"FAKE_OPENAI_URL": fake.base_url, "NOTE_LOG": str(notes)}
        arrived, release = fake.hold(3)  # turn 3's first request waits: the worker is mid-run, turns 1-2 done
        first = worker_process("tests.llm.apps_llm:app", "--worker-id", "w1", env=env)
        reply_task = asyncio.ensure_future(
            runtime.send_message([TextBlock(text="research nats")], AgentId("researcher", "r1"), timeout=90)
        )
        await asyncio.wait_for(arrived.wait(), 60)
        os.kill(first.pid, signal.SIGKILL)
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
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


def _logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(tmp_path.glob("worker*.log")))
