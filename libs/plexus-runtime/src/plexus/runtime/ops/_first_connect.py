"""The first connection to NATS: bounded for clients, patient for services.

nats-py retries a first connection forever when reconnects are unlimited (which every long-lived Plexus
connection wants after it is up): a command pointed at the wrong URL printed a warning every 2 s and never
ended. `connect_nats` bounds the first connection by `wait_s` and then raises `NatsUnreachableError` naming
the servers and the last error; ``wait_s=None`` waits as long as it takes (a worker started before its
server, in a container), which its caller must make stoppable.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client as NATS

__all__ = ["CLIENT_CONNECT_WAIT_S", "NatsUnreachableError", "connect_nats"]

#: How long a client (`Runtime.connect`'s default, the CLI's commands) tries its first connection.
CLIENT_CONNECT_WAIT_S = 10.0


class NatsUnreachableError(ConnectionError):
    """No server of `servers` accepted a first connection within `wait_s`; `last_error` says why."""

    def __init__(self, servers: Sequence[str], wait_s: float, last_error: BaseException | None) -> None:
        self.servers = list(servers)
        self.wait_s = wait_s
        self.last_error = last_error
        # Some refusals carry no text (an HTTP port answering a NATS client): name their type then.
        why = (str(last_error) or type(last_error).__name__) if last_error is not None else "no answer"
        super().__init__(f"cannot connect to {', '.join(self.servers)} within {wait_s:g} s: {why}")


async def connect_nats(servers: Sequence[str], wait_s: float | None, **options: Any) -> NATS:
    """``nats.connect(servers=servers, **options)``, its first connection bounded by `wait_s` (None: not)."""
    if wait_s is not None and not wait_s > 0:
        raise ValueError(f"the connect wait must be positive or None, got {wait_s}")
    nc = NATS()
    try:
        async with asyncio.timeout(wait_s):
            await nc.connect(servers=list(servers), **options)
    except TimeoutError:
        last = nc.last_error
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await nc.close()
        raise NatsUnreachableError(servers, wait_s or 0.0, last) from None
    return nc
