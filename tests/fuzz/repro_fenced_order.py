"""Minimal reproducer of the open defect behind the fuzz harness's "per-key order broken" failure:
`python -m tests.fuzz.repro_fenced_order`.

Input: any client appends one entry to a live agent's EventLog subject (`px.default.evlog.echo.f6`, here
`[{"type":"junk"}]`), then three messages A, B, C go to that agent's durable inbox.
Symptom: the owner's commit of A is fenced ("EventLog moved"); `Worker._run_one` takes itself for a zombie and
leaves A unacked with no nak, so B and C are handled and answered first and A only after a full `ack_wait`
(5 s here, 30 s by default): per-key order is broken and A is late. Printed on the tree of 2026-11-24:
`replies (s after send, tag): [(0.01, 'B'), (0.01, 'C'), (5.0, 'A')]`. Exits 1 while the order is wrong.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from plexus.runtime import Runtime

from .found import _env, _headers
from .harness import Harness


class _FenceHarness(Harness):
    replies: list[tuple[float, str]]

    async def _fire(self, rt: Runtime, raw: NATS) -> None:
        js, inbox, subjects = raw.jetstream(), raw.new_inbox(), rt.subjects
        self.replies = []
        started = time.monotonic()

        async def collect(msg: Msg) -> None:
            self.replies.append((round(time.monotonic() - started, 2), msg.subject.rsplit(".", 1)[1]))

        await raw.subscribe(inbox + ".>", cb=collect)

        async def send(tag: str) -> None:
            msg_id, data = _env("echo/f6", f"{inbox}.{tag}")
            await js.publish(subjects.inbox("echo", "f6"), data, headers=_headers(msg_id))

        await send("warm")  # the agent is active, with a checkpoint
        await asyncio.sleep(0.5)
        await js.publish(subjects.evlog("echo", "f6"), b'[{"type":"junk"}]')
        started = time.monotonic()
        self.replies.clear()
        for tag in "ABC":
            await send(tag)
        await asyncio.sleep(12)  # longer than the harness worker's ack_wait (5 s)


def main() -> int:
    harness = _FenceHarness(0, 0, Path(tempfile.mkdtemp(prefix="plexus-fence-")))
    asyncio.run(harness.run())
    print("replies (s after send, tag):", harness.replies)
    in_order = [tag for _, tag in harness.replies] == ["A", "B", "C"]
    print("per-key order kept" if in_order else "per-key order BROKEN")
    return 0 if in_order else 1


if __name__ == "__main__":
    sys.exit(main())
