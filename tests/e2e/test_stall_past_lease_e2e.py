"""Issue 36, item 5, on real worker processes: a worker frozen (SIGSTOP) past its lease with a handler held
and the key's next messages fetched behind it. The new owner handles the key's messages once each and in
order, and none waits an ``ack_wait`` (set far beyond the sends' timeout): neither those the frozen worker
had fetched nor those sent after it resumed. The deterministic check of the mechanism (a resumed worker
pulling from its successor's consumer) is tests/runtime/test_stall_past_lease.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from plexus.core import AgentId, TextBlock
from plexus.runtime import Runtime
from tests.freeze import freeze
from tests.runtime.conftest import LEASE_TTL_S, WorkerProcess
from tests.runtime.test_failover import FAST_WORKER, _eventually, _spread

APP = "tests.e2e.apps_stall:app"
#: Far beyond SEND_TIMEOUT_S: a message left to wait for its ack_wait fails its send.
ACK_WAIT = ("--ack-wait", "120")
SEND_TIMEOUT_S = 45.0


async def test_a_key_keeps_its_order_when_its_worker_stalls_past_the_lease(
    runtime: Runtime, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    rt = runtime
    agent = AgentId("fifo", "k11")
    frozen = worker_process(
        APP, "--worker-id", "wa", *FAST_WORKER, *ACK_WAIT, env={"PLEXUS_TEST_HOLD_S": "30"}
    )
    await _eventually(_spread(rt, "fifo", "wa"), "wa to own every partition", [frozen], tmp_path)

    async def send(text: str) -> list[str]:
        blocks = await rt.send_message([TextBlock(text=text)], agent, timeout=SEND_TIMEOUT_S)
        seen: list[str] = json.loads(str(getattr(blocks[0], "text", "")))["state"]["seen"]
        return seen

    # The held message and the key's next ones, stored in this order; wa fetches them all.
    first = [asyncio.create_task(send("hold"))]
    for n in range(1, 6):
        await asyncio.sleep(0.05)
        first.append(asyncio.create_task(send(str(n))))
    await asyncio.sleep(1.0)
    await freeze(frozen.pid)
    try:
        await asyncio.sleep(LEASE_TTL_S + 1.0)  # its leases lapse
        other = worker_process(APP, "--worker-id", "wb", *FAST_WORKER, *ACK_WAIT)
        await _eventually(_spread(rt, "fifo", "wb"), "wb to own every partition", [other], tmp_path)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    later = [await send(str(n)) for n in range(6, 21)]  # sent while the resumed wa is still pulling
    earlier = await asyncio.gather(*first)
    expected = ["hold", *(str(n) for n in range(1, 21))]
    final = await send("read")
    assert final == expected, final  # each once, in the order stored
    # Every reply is the state right after its own message: nothing ran out of order or twice.
    assert [*earlier, *later] == [expected[: n + 1] for n in range(len(expected))]
