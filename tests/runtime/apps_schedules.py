"""Agent types of the timer and reminder tests (tests/runtime/test_schedules.py), also run as `plexus worker`.

`timers` takes one text block of space-separated words: ``timer <sink key> <seconds>`` (a one-shot timer
that delivers ``fired <sink key>`` to `sink/<key>`; replies its id), ``cancel <id>``, ``remind <name>``
(every second), ``clear <name>``, ``list`` (its reminders), ``flaky <sink key> <seconds>`` (schedules a
timer, then fails its commit the first time: a state too big to store), ``many <sink key> <seconds> <n>``
(n timers in one handler run), ``read`` (its state). A reminder's
``tick`` is counted in its state. `sink` records every text it receives; ``read`` returns them.
"""

from __future__ import annotations

import datetime
import json

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context

app = App()

#: In-process only: how many times `flaky` ran (its first run's commit fails, so it runs again in place).
FLAKY_RUNS: dict[str, int] = {}


def _text(blocks: list[BaseBlock]) -> str:
    return " ".join(str(getattr(b, "text", "")) for b in blocks)


def _json(value: object) -> list[BaseBlock]:
    return [TextBlock(text=json.dumps(value))]


@app.agent("timers", description="sets timers and reminders as told")
class Timers(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        words = _text(blocks).split()
        verb, args = words[0], words[1:]
        if verb == "tick":
            self.state["ticks"] = int(self.state.get("ticks", 0)) + 1
            return []
        if verb in ("timer", "flaky"):
            sink = AgentId("sink", args[0])
            after = datetime.timedelta(seconds=float(args[1]))
            schedule_id = await ctx.schedule_message(sink, [TextBlock(text=f"fired {args[0]}")], after=after)
            if verb == "flaky":
                FLAKY_RUNS[ctx.message_id] = FLAKY_RUNS.get(ctx.message_id, 0) + 1
                if FLAKY_RUNS[ctx.message_id] == 1:
                    self.state["blob"] = "x" * 2_000_000  # more than a checkpoint holds: the commit fails
                else:
                    self.state.pop("blob", None)
            return _json(schedule_id)
        if verb == "many":
            for _ in range(int(args[2])):
                await ctx.schedule_message(
                    AgentId("sink", args[0]),
                    [TextBlock(text=f"fired {args[0]}")],
                    after=datetime.timedelta(seconds=float(args[1])),
                )
        if verb == "nobody":  # an unregistered type: AgentNotFoundError, nothing recorded
            await ctx.schedule_message(AgentId("nobody", "x"), [], after=datetime.timedelta(seconds=1))
        if verb == "cancel":
            await ctx.cancel_schedule(args[0])
        elif verb == "remind":
            await ctx.set_reminder(
                args[0], every=datetime.timedelta(seconds=1), blocks=[TextBlock(text="tick")]
            )
        elif verb == "clear":
            await ctx.clear_reminder(args[0])
        elif verb == "list":
            return _json(await ctx.reminders())
        return _json(self.state)


@app.agent("sink", description="records the texts it receives")
class Sink(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        text = _text(blocks)
        if text != "read":
            self.state.setdefault("got", []).append(text)
        return _json(self.state.get("got", []))
