"""An agent type the in-place retry tests run in a real `plexus worker` process (so it can be SIGKILLed).

`flaky` appends a line to the file named by ``RETRY_LOG`` each time its handler starts (a count that
survives the process), then acts on that count: the first start fails (a retry in place), the second
parks until the test kills its worker (a crashed attempt), any later one answers.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from plexus.core import BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context

app = App()


def _count_start() -> int:
    log = Path(os.environ["RETRY_LOG"])
    with log.open("a") as f:
        f.write(f"{os.getpid()}\n")
    return len(log.read_text().splitlines())


@app.agent("flaky", description="fails its first start, hangs in its second, answers after that")
class Flaky(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        start = _count_start()
        if start == 1:
            raise ValueError("the first start fails")
        if start == 2:
            await asyncio.sleep(3600)  # parked: the test kills this worker
        return [TextBlock(text=f"ok after {start} starts")]
