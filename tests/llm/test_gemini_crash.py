"""★ The crash test of `test_crash_replay` for Gemini: a worker SIGKILLed between turn 2 and turn 3 of a
4-turn run; the retried handler on another worker replays turns 1-2 from the journal (never requested
again), and the thought signatures of the replayed turns go back byte for byte (the fake refuses a changed
or missing one with the service's 400)."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from pathlib import Path
from typing import Any

from plexus.core import AgentId, TextBlock
from plexus.runtime import Runtime

from .fake_gemini import Signatures, gemini_frames, turn_of
from .fake_providers import Answer, FakeProvider, Sse
from .test_crash_replay import _hosted, _kill, _logs


async def test_sigkill_between_turn_2_and_3_replays_turns_and_their_signatures_byte_for_byte(
    runtime: Runtime, worker_process: Any, tmp_path: Path
) -> None:
    per_turn: Counter[int] = Counter()
    sigs = Signatures()
    refused: list[str] = []

    def respond(body: dict[str, Any]) -> Answer:
        if (refusal := sigs.check(body)) is not None:
            refused.append(str(refusal.body))
            return refusal
        turn = turn_of(body)
        per_turn[turn] += 1
        if turn < 4:
            return Sse(gemini_frames(f"step {turn}", [sigs.call("note", {"text": f"t{turn}"})]))
        return Sse(gemini_frames("done after 4 turns"))

    async with FakeProvider(respond, base_path="") as fake:
        notes = tmp_path / "notes.log"
        env = {"FAKE_GEMINI_URL": fake.base_url, "NOTE_LOG": str(notes)}
        arrived, release = fake.hold(3)  # turn 3's first request waits: the worker is mid-run, turns 1-2 done
        first = worker_process("tests.llm.apps_gemini:app", "--worker-id", "w1", env=env)
        await _hosted(runtime)
        reply_task = asyncio.ensure_future(
            runtime.send_message([TextBlock(text="research nats")], AgentId("researcher", "g1"), timeout=90)
        )
        await asyncio.wait_for(arrived.wait(), 60)
        await _kill(first)
        release.set()
        worker_process("tests.llm.apps_gemini:app", "--worker-id", "w2", env=env)
        reply = await asyncio.wait_for(reply_task, 90)

    assert refused == [], (refused, _logs(tmp_path))
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done after 4 turns"]
    # Turns 1 and 2 were paid once; turn 3 twice (its first call died with the worker).
    assert per_turn == Counter({1: 1, 2: 1, 3: 2, 4: 1}), (per_turn, _logs(tmp_path))
    assert fake.count == 5
    assert notes.read_text().split() == ["t1", "t2", "t3"]
    # Turn 3's retry, built by the second worker from the journal, carries turns 1-2 with the signatures
    # the fake issued, byte for byte, on their calls (the SDK writes bytes URL-safe base64).
    retry = fake.requests[3]
    signed = [
        (p["functionCall"]["args"]["text"], p["thoughtSignature"])
        for c in retry["contents"]
        if c["role"] == "model"
        for p in c["parts"]
        if "functionCall" in p
    ]
    expected = [
        (f"t{n}", base64.urlsafe_b64encode(sigs.issued[Signatures.key("note", {"text": f"t{n}"})]).decode())
        for n in (1, 2)
    ]
    assert signed == expected
    # ... exactly as the first worker sent them before it died.
    assert retry["contents"] == fake.requests[2]["contents"]
