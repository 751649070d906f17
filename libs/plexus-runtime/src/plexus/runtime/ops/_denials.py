"""Permission violations as `PermissionDeniedError`, at once.

nats-server answers a publish or subscription the user may not make with an asynchronous
``-ERR 'Permissions Violation for Publish to "<subject>"'`` and nothing else: a request to a denied subject
just goes unanswered, which looks exactly like an outage (a timeout) and used to be waited out as one. The
connection's error callback (`DenialWatch.on_error`) turns the violation into a typed error, and
`raise_on_denial` runs an awaitable until it ends or a violation arrives, whichever is first: connecting, a
worker's start, an orchestrator's start and each CLI command run under it, so a misconfigured identity fails
in one line.

nats-py lower-cases the server's error text, so the subject is reported in lower case.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable
from typing import Any, TypeVar

from plexus.core import PermissionDeniedError

__all__ = ["DenialWatch", "parse_violation", "raise_on_denial"]

log = logging.getLogger("plexus.nats")

T = TypeVar("T")

_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"', re.IGNORECASE)

#: How long a cancelled work gets to stop before it is cancelled again (see `raise_on_denial`).
_RECANCEL_S = 0.05

#: The waiting `raise_on_denial` calls: each with the connection it watches (None: any connection).
_waiters: dict[asyncio.Future[PermissionDeniedError], object | None] = {}


def parse_violation(text: str, user: str) -> PermissionDeniedError | None:
    """The `PermissionDeniedError` a server error text describes, or None if it is no permission violation."""
    match = _VIOLATION.search(text)
    if match is None:
        return None
    operation = "publish to" if match.group(1).lower() == "publish" else "subscribe to"
    return PermissionDeniedError(match.group(2), operation, user)


class DenialWatch:
    """The error callback of one connection (nats-py's ``error_cb``), for the user it connects as."""

    def __init__(self, user: str | None) -> None:
        self.user = user or "(anonymous)"
        #: The connection this watch reports for (set once connected): `raise_on_denial(..., source=...)`.
        self.source: object | None = None

    async def on_error(self, exc: Exception) -> None:
        denied = parse_violation(str(exc), self.user)
        if denied is None:
            log.warning("nats: %s", exc)
            return
        if not _report(self.source, denied):
            # Nobody waits to raise it (a steady-state violation, e.g. a handler's send): say it loudly.
            log.error("%s", denied)


def _report(source: object | None, denied: PermissionDeniedError) -> bool:
    told = False
    for waiter, watched in list(_waiters.items()):
        if (watched is None or watched is source) and not waiter.done():
            waiter.set_result(denied)
            told = True
    return told


async def raise_on_denial(work: Awaitable[T], source: object | None = None) -> T:
    """Await `work`; if a permission violation arrives first (on `source`'s connection, or on any connection
    of this process when `source` is None), cancel it and raise the `PermissionDeniedError`."""
    denied: asyncio.Future[PermissionDeniedError] = asyncio.get_running_loop().create_future()
    _waiters[denied] = source
    task = asyncio.ensure_future(work)
    try:
        racers: set[asyncio.Future[Any]] = {task, denied}
        await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        # nats-py drops a cancellation that lands in a publish's flush (`Client._flush_pending` catches
        # CancelledError), and the work then runs on until its own timeouts: cancel until it has stopped.
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=_RECANCEL_S)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            task.result()
        raise denied.result()
    finally:
        _waiters.pop(denied, None)
        if not task.done():
            task.cancel()
