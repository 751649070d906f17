"""The floor of the LLM loop: a Plexus run's durable work, hand-written on nats-py and the SDK, no framework.

`bench.llm_bench` times it beside the Plexus run, in the same rounds, as raw nats-py is timed beside Plexus's
messaging: what any implementation of the same guarantees pays on this machine, so the goal (≤ 1 ms per turn
inside the handler) can be read against what the machine allows. One run, per model turn:

- a ``thinking`` progress event, published to a JetStream stream (its ack awaited when the run ends, as the
  worker awaits a handler's progress acks);
- the streamed SDK call with the run's recorded request body (so no conversion of a transcript), each text
  delta published on a core subject as it arrives, tool-call fragments joined by index;
- the turn appended to a journal stream, fenced by the subject's last sequence (``Nats-Expected-Last-Subject-
  Sequence``) and acknowledged before the tool runs or the next call starts (the final turn's ack is awaited
  after the loop, as Plexus settles it after its iterations);
- for a tool call: ``tool_call`` and ``tool_result`` progress events around the sync tool run in a thread
  (``asyncio.to_thread``), its result appended to the journal the same way;
- the usage added to an in-process counter (a run that is not orchestrated consumes its budget locally),
  or, with ``counters`` (the floor of an orchestrated run), sent as two ``Nats-Incr`` increments (tokens,
  turns) to a counter stream and checked against the budget once both acks are in, before the turn is
  journaled (a turn is journaled only once counted, as in Plexus).

What it leaves out, on purpose, because it is the framework's part: typed items and their validation, the
transcript's conversion to the provider's messages, middleware, interceptors, records for the agent's
EventLog, the activation, the commit and the reply.

``python -m bench.llm_floor_parts [--runs N]`` measures what the floor itself is made of. This module imports
nothing of `bench.llm_bench`, which imports it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection
from typing import Any

import msgspec

__all__ = ["PARTS", "Floor"]

_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder().decode
_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
#: The floor's budget per counter (as large as the bench's: never reached).
_BUDGET = 10**12
#: Parts `Floor` can leave out (``python -m bench.llm_floor_parts`` measures each one's share).
PARTS = ("journal", "progress", "thread")


class Floor:
    """The hand-written loop against one nats-server (its own two streams) and one SDK ``create``."""

    def __init__(
        self,
        nc: Any,
        create: Callable[..., Any],
        bodies: list[dict[str, Any]],
        tool: Callable[..., Any],
        *,
        counters: bool = False,
        name: str = "k",
        leave_out: Collection[str] = (),
    ) -> None:
        if unknown := set(leave_out) - set(PARTS):
            raise ValueError(f"unknown parts {sorted(unknown)}; the parts are {PARTS}")
        self._journal = "journal" not in leave_out
        self._progress = "progress" not in leave_out
        self._thread = "thread" not in leave_out
        self._nc = nc
        self._counters = counters
        self._name = name  # keys are <name><i>: a new, empty journal subject for every run
        self._create = create
        self._bodies = bodies
        self._tool = tool
        self._acks: dict[str, asyncio.Future[bytes]] = {}
        self._next_ack = 0
        self._prefix = ""
        self.loop_times: dict[int, float] = {}
        self.tokens = 0

    async def start(self) -> None:
        from nats.js.api import StreamConfig

        js = self._nc.jetstream()
        await js.add_stream(StreamConfig(name="FLOOR_JOURNAL", subjects=["floor.journal.>"]))
        await js.add_stream(StreamConfig(name="FLOOR_PROGRESS", subjects=["floor.progress.>"]))
        if self._counters:
            counters = StreamConfig(name="FLOOR_COUNTERS", subjects=["floor.ctr.>"], allow_msg_counter=True)
            await js.add_stream(counters)
        self._prefix = self._nc.new_inbox()
        await self._nc.subscribe(self._prefix + ".*", cb=self._on_ack)

    async def _on_ack(self, msg: Any) -> None:
        future = self._acks.pop(msg.subject, None)
        if future is not None and not future.done():
            future.set_result(msg.data)

    async def _publish_acked(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> asyncio.Future[bytes]:
        """Publish to a stream; the future resolves with the server's ack."""
        self._next_ack += 1
        reply = f"{self._prefix}.{self._next_ack}"
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._acks[reply] = future
        await self._nc.publish(subject, data, reply=reply, headers=headers)
        return future

    @staticmethod
    async def _stored(ack: asyncio.Future[bytes]) -> int:
        """The stream sequence of a stored message (raises if the server refused it)."""
        answer = _DECODE(await ack)
        if "error" in answer:
            raise RuntimeError(f"not stored: {answer['error']}")
        return int(answer["seq"])

    async def _consume(self, key: str, tokens: int) -> None:
        """The tree's counters moved by one model call, both increments at once; over budget raises."""
        acks = [
            await self._publish_acked(f"floor.ctr.{key}.tokens", b"", {"Nats-Incr": str(tokens)}),
            await self._publish_acked(f"floor.ctr.{key}.turns", b"", {"Nats-Incr": "1"}),
        ]
        for ack in acks:
            answer = _DECODE(await ack)
            if "error" in answer or int(answer["val"]) > _BUDGET:
                raise RuntimeError(f"over budget or not counted: {answer}")

    async def _emit(self, subject: str, event: dict[str, Any], acks: list[asyncio.Future[bytes]]) -> None:
        if self._progress:
            acks.append(await self._publish_acked(subject, _ENCODE(event)))

    async def _append(self, subject: str, step: dict[str, Any], seq: int) -> asyncio.Future[bytes] | None:
        """Send one journal step fenced by ``seq``; the future of its ack (None without a journal)."""
        if not self._journal:
            return None
        return await self._publish_acked(subject, _ENCODE(step), {_EXPECTED: str(seq)})

    async def run(self, i: int) -> None:
        """One run of 2 model turns + 1 tool to a new key ``i``; its loop time goes to ``loop_times[i]``."""
        key = f"{self._name}{i}"
        journal, progress, deltas = f"floor.journal.{key}", f"floor.progress.{key}", f"floor.stream.{key}"
        progress_acks: list[asyncio.Future[bytes]] = []
        seq = 0  # a new key: its journal is empty
        t0 = time.perf_counter()
        last: asyncio.Future[bytes] | None = None
        for step, body in enumerate(self._bodies):
            event = {"step": "thinking", "agent": key, "ts": time.time(), "metadata": {"step": step}}
            await self._emit(progress, event, progress_acks)
            text: list[str] = []
            calls: dict[int, dict[str, Any]] = {}
            usage = None
            async for chunk in await self._create(**body):
                usage = chunk.usage or usage
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                if delta.content:
                    text.append(delta.content)
                    await self._nc.publish(deltas, _ENCODE({"type": "text_delta", "text": delta.content}))
                for fragment in delta.tool_calls or ():
                    call = calls.setdefault(fragment.index, {"id": "", "name": "", "arguments": []})
                    call["id"] = fragment.id or call["id"]
                    if fragment.function is not None:
                        call["name"] = fragment.function.name or call["name"]
                        call["arguments"].append(fragment.function.arguments or "")
            tokens = usage.total_tokens if usage is not None else 0
            if self._counters:
                await self._consume(key, tokens)
            else:
                self.tokens += tokens
            uses = [
                {"id": c["id"], "name": c["name"], "input": json.loads("".join(c["arguments"]) or "{}")}
                for c in calls.values()
            ]
            turn = {"step": 2 * step, "text": "".join(text), "tool_calls": uses}
            if last is not None:
                seq = await self._stored(last)
            last = await self._append(journal, turn, seq)
            if not uses:
                continue
            if last is not None:
                seq = await self._stored(last)  # the tool acts only on a stored turn
                last = None
            event = {"step": "tool_call", "agent": key, "ts": time.time(), "content": uses}
            await self._emit(progress, event, progress_acks)
            if self._thread:
                results = [await asyncio.to_thread(self._tool, **u["input"]) for u in uses]
            else:
                results = [self._tool(**u["input"]) for u in uses]
            event = {"step": "tool_result", "agent": key, "ts": time.time(), "content": results}
            await self._emit(progress, event, progress_acks)
            answer = {"step": 2 * step + 1, "results": results}
            last = await self._append(journal, answer, seq)
        self.loop_times[i] = time.perf_counter() - t0
        if last is not None:
            await self._stored(last)
        for ack in progress_acks:
            await self._stored(ack)
