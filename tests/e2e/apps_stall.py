"""The agent type of the stall-past-lease test, run in real `plexus worker` processes.

`fifo` appends each message's text to its checkpointed state and answers with that state. A worker started
with ``PLEXUS_TEST_HOLD_S`` holds the message ``hold`` that long in its handler (so the key's next messages
wait, fetched, behind it); elsewhere ``hold`` is handled at once.
"""

from __future__ import annotations

import asyncio
import json
import os

from plexus.core import BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context

app = App()


@app.agent("fifo", description="records the texts of its messages in order")
class Fifo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        text = " ".join(str(getattr(b, "text", "")) for b in blocks)
        if text == "hold":
            await asyncio.sleep(float(os.environ.get("PLEXUS_TEST_HOLD_S", "0")))
        if text != "read":
            self.state.setdefault("seen", []).append(text)
        return [TextBlock(text=json.dumps({"pid": os.getpid(), "state": self.state}))]
