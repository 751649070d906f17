"""Agent types the failover tests run in real `plexus worker` processes.

Every handler invocation is first recorded durably with `ctx.emit_progress` (a JetStream publish into
``PLEXUS_PROGRESS`` that is acknowledged before the handler goes on), carrying the message's sequence number
and the worker's pid. That log survives a SIGKILL, so the test can count invocations — including those that
died with their worker — independently of the agent's checkpointed state.

Messages are one text block: ``"<seq>"`` (record it), ``"read"`` (return the state), ``"sleep <seconds>"``.
Replies are one text block holding a JSON object with the worker's pid and the agent's state.

A test that wants a worker killed mid-handler names a file in ``LEDGER_KILL_FILE`` and writes ``"<pid> <n>"``
into it: the worker with that pid SIGKILLs itself inside its n-th ledger invocation, after recording it and
before its state change is checkpointed. Timed from inside, the kill always leaves work for the survivor;
timed by the test's own view of the replies, a loaded machine could deliver them so late that the victim
had already answered everything (a flake seen in CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from plexus.core import AgentStep, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context

#: `ledger`: records message sequence numbers in its durable state (single activation + FIFO per key).
app = App()
#: `slow`: sleeps as told, counting its invocations (graceful drain, keep-alive past ack_wait).
slow_app = App()

#: A short await inside the ledger handler, so handlers of different keys overlap and a SIGKILL lands
#: mid-handler for some of them.
LEDGER_PAUSE_S = 0.005
#: Names the file holding ``"<pid> <n>"`` (see the module docstring); unset, no worker kills itself.
KILL_FILE_ENV = "LEDGER_KILL_FILE"
_invocations = 0


def _kill_if_told() -> None:
    """SIGKILL this process when the kill file names it and its ledger invocations reached the count."""
    global _invocations
    _invocations += 1
    name = os.environ.get(KILL_FILE_ENV)
    if not name or not (path := Path(name)).exists():
        return
    pid, count = (int(word) for word in path.read_text().split())
    if pid == os.getpid() and _invocations >= count:
        os.kill(os.getpid(), signal.SIGKILL)


def _text(blocks: list[BaseBlock]) -> str:
    return " ".join(str(getattr(b, "text", "")) for b in blocks)


def _answer(state: dict[str, object]) -> list[BaseBlock]:
    return [TextBlock(text=json.dumps({"pid": os.getpid(), "state": state}))]


@app.agent("ledger", description="records per-key sequence numbers in its checkpointed state")
class Ledger(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        text = _text(blocks)
        if text == "read":
            return _answer(self.state)
        seq = int(text)
        await ctx.emit_progress(AgentStep.TOOL_CALL, metadata={"seq": seq, "pid": os.getpid()})
        _kill_if_told()
        seen = self.state.setdefault("seen", [])
        seen.append(seq)
        await asyncio.sleep(LEDGER_PAUSE_S)
        return _answer(self.state)


@slow_app.agent("slow", description="sleeps as told and counts its invocations")
class Slow(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        text = _text(blocks)
        if text == "read":
            return _answer(self.state)
        _, seconds = text.split()
        await ctx.emit_progress(AgentStep.STARTED, metadata={"pid": os.getpid(), "message": ctx.message_id})
        self.state["runs"] = int(self.state.get("runs", 0)) + 1
        await asyncio.sleep(float(seconds))
        return _answer(self.state)
