"""The durable floor's variants: the floor with one property of Plexus's durable send added each.

`bench/durable_floor.py` runs them. ``bytes``: Plexus's sizes on the wire. The inbox message is a send
envelope as `Runtime.send_message` publishes it (≈ 470 bytes of JSON, ``Nats-Msg-Id`` and ``Plexus-V``
headers, the reply subject inside the body); the append is the three entries a durable echo commits
(received, reply, and the ``plexus.committed`` marker holding the encoded reply: ≈ 825 bytes, with Plexus's
three headers, ≈ 140 bytes here for a longer stream name), without the marker (≈ 405 bytes) when the
message writes the checkpoint; the reply is the reply envelope (≈ 245 bytes). ``parts``: Plexus's topology.
The inbox stream partitions keys by a subject transform into 16 partitions, each read by a filtered pull
consumer, plus 16 idle consumers standing for the worker's second durable type; 32 pullers share 256
handler slots and ask for at most 8 messages each, as a worker with 2 durable types does (other variants:
fewer partitions, one type, a fixed pull size). ``ckpt``: a KV write (compare-and-swap on the revision)
every 16th message of a key, the size of a busy key's checkpoint (64 handled ids, the newest 16 with their
encoded replies: ≈ 7.8 KB). ``busy_us`` burns CPU in the serving process per message, to see what the
serving side's own work costs nats-server on a shared machine.

The texts are built from templates of what Plexus sends (captured from a worker of `bench.plexus_bench`),
with fresh ids and timestamps; the serving side finds what it needs by position rather than decoding the
JSON, so a variant adds bytes, not parsing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg

from bench.common import PAYLOAD

#: Partitions of the inbox, and the worker's handler slots and largest pull (4 × 64 slots over 2 × 16).
PARTITIONS = 16
SLOTS = 256
MAX_BATCH = 8
#: A key's checkpoint is written every this many messages (Plexus's `CHECKPOINT_EVERY`).
CHECKPOINT_EVERY = 16
#: Message ids a checkpoint remembers, and how many of the newest keep their reply (Plexus's values).
HANDLED_MEMORY = 64
REPLY_MEMORY = 16
#: How long the server keeps a pull request open.
EXPIRES_NS = 1_000_000_000
HANDLED_BY = "vm-24049-7fa9e07e6d10"


@dataclass(frozen=True)
class Variant:
    """Which of Plexus's properties a floor serving side adds."""

    name: str
    bytes: bool = False
    #: Partitions of the inbox per agent type (0: one unfiltered consumer, fetched as raw.js does).
    partitions: int = 0
    ckpt: bool = False
    #: Durable agent types with a consumer per partition (the second one idle, as the bench worker's).
    types: int = 2
    #: The largest pull (0: as a worker computes it from its slots).
    batch: int = 0
    #: CPU time the serving side burns per message, standing for a framework's own work.
    busy_us: int = 0

    @property
    def parts(self) -> bool:
        return self.partitions > 0

    @property
    def max_batch(self) -> int:
        """The largest pull; a worker's: every partition of every type keeps a request open."""
        return self.batch or max(1, min(64, SLOTS // (self.types * self.partitions)))

    @property
    def tag(self) -> str:
        """A token for this variant's stream, consumer and subject names."""
        return self.name.replace("-", "_").upper()


VARIANTS = {
    v.name: v
    for v in (
        Variant("floor"),
        Variant("floor-bytes", bytes=True),
        Variant("floor-parts", partitions=PARTITIONS),
        Variant("floor-ckpt", ckpt=True),
        Variant("floor-all", bytes=True, partitions=PARTITIONS, ckpt=True),
        # Fewer partitions, hence larger pulls (32 and 64 messages): what a topology change would give.
        Variant("floor-parts4", partitions=4),
        Variant("floor-parts1", partitions=1),
        Variant("floor-all4", bytes=True, partitions=4, ckpt=True),
        # Apart: the number of consumers (16 partitions of one type, pulls ≤ 16) and the pull size alone
        # (1 partition per type, pulls ≤ 8).
        Variant("floor-parts-1type", partitions=PARTITIONS, types=1),
        Variant("floor-parts1-b8", partitions=1, batch=MAX_BATCH),
        # Whether the serving side's own CPU (contention for 2 cores) raises nats-server's per message:
        # floor-all burning what Plexus's worker spends beyond it.
        Variant("floor-all-busy", bytes=True, partitions=PARTITIONS, ckpt=True, busy_us=90),
    )
}


def busy(us: int) -> None:
    """Burn `us` microseconds of CPU (the thread's own time, so waiting for the core does not count)."""
    end = time.thread_time_ns() + us * 1000
    while time.thread_time_ns() < end:
        pass


def ulid() -> str:
    """26 characters of Crockford-like base32, the shape of Plexus's ids (random, not time-ordered)."""
    return "01" + base64.b32encode(os.urandom(15)).decode()


# -- what the client sends -------------------------------------------------------------------------------
def envelope(msg_id: str, key: str, reply_to: str) -> bytes:
    """A send envelope as `Runtime.send_message` encodes it for a durable echo."""
    now = time.time()
    return (
        f'{{"v":1,"id":"{msg_id}","kind":"send","target":"echo/{key}","reply_to":"{reply_to}",'
        f'"payload":[{{"type":"text","metadata":{{}},"text":"{PAYLOAD}"}}],'
        f'"run":{{"run_id":"run_{msg_id[4:]}","root_id":"run_{msg_id[4:]}","priority":2}},'
        f'"sent_at":{now!r},"deadline":{now + 30.0!r}}}'
    ).encode()


def _field(data: bytes, name: bytes) -> str:
    """The value of a string field of a flat JSON text we built (no escapes in ids or subjects)."""
    start = data.index(b'"' + name + b'":"') + len(name) + 4
    return data[start : data.index(b'"', start)].decode()


def envelope_fields(data: bytes) -> tuple[str, str]:
    """(message id, reply subject) of an envelope."""
    return _field(data, b"id"), _field(data, b"reply_to")


# -- what the serving side writes ------------------------------------------------------------------------
def reply(msg_id: str) -> str:
    """The reply envelope of a durable echo."""
    return (
        f'{{"v":1,"id":"{msg_id}","ok":true,"payload":[{{"type":"text","metadata":{{}},'
        f'"text":"{PAYLOAD}"}}],"handled_by":"{HANDLED_BY}"}}'
    )


def append(msg_id: str, key: str, reply_text: str, marker: bool) -> bytes:
    """The commit's entries: received, reply and (unless the checkpoint is written) the marker."""
    now = time.time()
    entries = (
        f'[{{"type":"msg.received","timestamp":{now!r},"id":"{ulid()}","run_id":"run_{msg_id[4:]}",'
        f'"agent_id":"echo/{key}","message_id":"{msg_id}","sender":null}},'
        f'{{"type":"reply","timestamp":{now!r},"id":"{ulid()}","text":"{PAYLOAD}"}}'
    )
    if marker:
        encoded = reply_text.replace('"', '\\"')
        entries += (
            f',{{"type":"plexus.committed","timestamp":{now!r},"id":"{ulid()}",'
            f'"message_id":"{msg_id}","reply":"{encoded}"}}'
        )
    return (entries + "]").encode()


def append_headers(expected: int, stream: str, append_id: str) -> dict[str, str]:
    return {
        "Nats-Expected-Last-Subject-Sequence": str(expected),
        "Nats-Expected-Stream": stream,
        "Plexus-Append": append_id,
    }


class Handled:
    """One key's handled-message memory, as its checkpoint stores it (newest last)."""

    def __init__(self) -> None:
        # Full from the start: the bench's keys are busy ones, whose checkpoints are at their steady size.
        self.ids: deque[str] = deque((f"msg_{ulid()}" for _ in range(HANDLED_MEMORY)), maxlen=HANDLED_MEMORY)
        self.count = 0

    def add(self, msg_id: str) -> bool:
        """Remember `msg_id`; True when this message's commit writes the checkpoint."""
        self.ids.append(msg_id)
        self.count += 1
        return self.count % CHECKPOINT_EVERY == 0

    def checkpoint(self) -> bytes:
        ids = list(self.ids)
        old = ",".join(f'["{i}",null]' for i in ids[:-REPLY_MEMORY])
        new = ",".join(
            f'["{i}","{base64.b64encode(reply(i).encode()).decode()}"]' for i in ids[-REPLY_MEMORY:]
        )
        return f'{{"state":{{}},"handled":[{old},{new}]}}'.encode()


# -- Plexus's way of pulling ------------------------------------------------------------------------------
async def pull_partition(
    nc: Client,
    stream: str,
    durable: str,
    slots: asyncio.Semaphore,
    handle: Callable[[Msg], Awaitable[None]],
    max_batch: int = MAX_BATCH,
) -> None:
    """Pull one consumer for ever, asking for as many messages as free slots (≤ `max_batch`), each request
    held open by the server for a second; `handle` gets each message with one slot, which it releases."""
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def deliver(msg: Msg) -> None:
        queue.put_nowait(msg)

    inbox = nc.new_inbox()
    await nc.subscribe(inbox, cb=deliver)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
    loop = asyncio.get_running_loop()
    while True:
        await slots.acquire()
        free = 1
        while free < max_batch and not slots.locked():
            await slots.acquire()
            free += 1
        await nc.publish(subject, json.dumps({"batch": free, "expires": EXPIRES_NS}).encode(), reply=inbox)
        got = 0
        deadline = loop.time() + EXPIRES_NS / 1e9 + 1.0
        while got < free:
            if queue.empty():
                try:
                    async with asyncio.timeout_at(deadline):
                        msg = await queue.get()
                except TimeoutError:
                    break
            else:
                msg = queue.get_nowait()
            if msg.reply and msg.reply.startswith("$JS.ACK."):
                got += 1
                await handle(msg)
            elif (msg.headers or {}).get("Status") != "100":
                break  # 404 / 408: nothing more for this request
        for _ in range(free - got):
            slots.release()
