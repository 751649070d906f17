"""★ The crash test of test_crash_replay.py over the Responses API: a worker SIGKILLed between turn 2 and
turn 3 of a 4-turn run of reasoning turns; the retried handler on another worker replays turns 1-2 from the
journal (requested once), and the reasoning items of the replayed turns go back byte-identical — the fake,
like the real service with ``store=False``, refuses a reasoning item changed or missing."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from plexus.core import AgentId, TextBlock
from plexus.runtime import Runtime

from .fake_providers import Answer, FakeProvider, Sse
from .fake_responses import Reasoning, ReasoningLedger, responses_frames
from .test_crash_replay import _hosted, _kill, _logs


def _turn_of(body: dict[str, Any]) -> int:
    """Which turn a request is for: one more than the function calls it carries (one per turn)."""
    return 1 + sum(1 for i in body["input"] if i.get("type") == "function_call")


def _reasoning(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in body["input"] if i.get("type") == "reasoning"]


async def test_sigkill_between_turn_2_and_3_replays_the_reasoning_items_byte_identical(
    runtime: Runtime, worker_process: Any, tmp_path: Path
) -> None:
    per_turn: Counter[int] = Counter()

    def respond(body: dict[str, Any]) -> Answer:
        turn = _turn_of(body)
        per_turn[turn] += 1
        if turn < 4:
            # A fresh encrypted payload per request: a turn asked again would not match the journaled one.
            reasoning = Reasoning([f"Plan {turn}."], f"ENC-{turn}-{per_turn[turn]}", id=f"rs_{turn}")
            call = (f"call_{turn}", "note", f'{{"text": "t{turn}"}}')
            return Sse(responses_frames(f"step {turn}", [call], reasoning=reasoning))
        return Sse(responses_frames("done after 4 turns"))

    ledger = ReasoningLedger(respond)
    async with FakeProvider(ledger) as fake:
        notes = tmp_path / "notes.log"
        env = {"FAKE_OPENAI_URL": fake.base_url, "FAKE_OPENAI_API": "responses", "NOTE_LOG": str(notes)}
        arrived, release = fake.hold(3)  # turn 3's first request waits: the worker is mid-run, turns 1-2 done
        first = worker_process("tests.llm.apps_llm:app", "--worker-id", "w1", env=env)
        await _hosted(runtime)
        reply_task = asyncio.ensure_future(
            runtime.send_message([TextBlock(text="research nats")], AgentId("researcher", "rr1"), timeout=90)
        )
        await asyncio.wait_for(arrived.wait(), 60)
        await _kill(first)
        release.set()
        worker_process("tests.llm.apps_llm:app", "--worker-id", "w2", env=env)
        reply = await asyncio.wait_for(reply_task, 90)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 4 turns"]
    assert per_turn == Counter({1: 1, 2: 1, 3: 2, 4: 1}), (per_turn, ledger.refusals, _logs(tmp_path))
    assert ledger.refusals == []
    assert notes.read_text().split() == ["t1", "t2", "t3"]
    before, retry = fake.requests[2], fake.requests[3]  # turn 3 from the live worker, then from the journal
    assert _reasoning(retry) == [ledger.issued["rs_1"], ledger.issued["rs_2"]]
    # The same bytes as the dead worker sent them (the JSON keeps the order of what was sent).
    assert [json.dumps(i) for i in _reasoning(retry)] == [json.dumps(i) for i in _reasoning(before)]
    assert retry["input"] == before["input"]
    # And turn 3's own reasoning (issued twice, once per request) goes to turn 4 as the retry issued it.
    assert _reasoning(fake.requests[4])[2]["encrypted_content"] == "ENC-3-2"
