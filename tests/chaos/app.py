"""Agents of the chaos run (`make chaos`), served by real `plexus worker` processes.

Every handler execution appends one line to its own process's record file (``$PLEXUS_CHAOS_DIR/exec-<pid>
.log``): ``start`` when it begins and ``end`` when its body returned, with the key, the message's number,
the pid and a timestamp. The invariant checker reads these append-only records, plus what the agents'
committed state says, to find re-executions and overlapping activations of a key.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from plexus.core import AgentId, BaseBlock, KernelError, SpawnDenied, TextBlock
from plexus.runtime import Agent, App, Context

app = App()


def _text(blocks: list[BaseBlock]) -> str:
    return "".join(getattr(b, "text", "") for b in blocks)


def _record(kind: str, key: str, n: int) -> None:
    """One line, one write() on an O_APPEND file: lines of concurrent handlers never interleave."""
    directory = os.environ.get("PLEXUS_CHAOS_DIR")
    if not directory:
        return
    line = json.dumps({"k": kind, "key": key, "n": n, "pid": os.getpid(), "t": time.time()}) + "\n"
    fd = os.open(Path(directory) / f"exec-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.agent("ledger", description="appends each numbered message to its durable state, in order")
class Ledger(Agent):
    """Input ``{"n": N}`` (``"hold": S`` keeps the handler busy S seconds) appends N to ``state["seen"]``;
    ``{"report": true}`` answers the whole list."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = json.loads(_text(blocks) or "{}")
        seen: list[int] = self.state.setdefault("seen", [])
        if cmd.get("report"):
            return [TextBlock(text=json.dumps(seen))]
        n = int(cmd["n"])
        _record("start", ctx.agent_id.key, n)
        seen.append(n)
        # A window in which a second activation of the key would show; ``hold`` makes it long on purpose.
        await asyncio.sleep(float(cmd.get("hold", 0.005)))
        _record("end", ctx.agent_id.key, n)
        return [TextBlock(text=str(len(seen)))]


@app.agent("forest", description="a run tree root: spawns `leaves` leaf agents that spend tokens")
class Forest(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = json.loads(_text(blocks) or "{}")
        results = []
        for i in range(int(cmd.get("leaves", 3))):
            try:
                reply = await ctx.spawn(
                    AgentId("leaf", f"{ctx.agent_id.key}-{i}"),
                    [TextBlock(text=json.dumps(cmd.get("leaf", {})))],
                    timeout=120,
                )
                results.append(_text(reply))
            except SpawnDenied:
                results.append("denied")
            except KernelError as exc:
                results.append(f"error:{exc.error_type}")
                if exc.error_type == "BudgetExhaustedError":
                    raise
        return [TextBlock(text=json.dumps(results))]


@app.agent("leaf", description="spends `tokens` per step for `steps` steps, checkpointing each step")
class Leaf(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = json.loads(_text(blocks) or "{}")
        steps, tokens = int(cmd.get("steps", 3)), int(cmd.get("tokens", 10))
        for step in range(int(self.state.get("step", 0)), steps):
            await ctx.usage(tokens=tokens)
            self.state["step"] = step + 1
            await ctx.checkpoint()
        return [TextBlock(text=f"{ctx.agent_id.key}:{steps}")]
