"""One wildcard subscription that answers many requests: what a request costs without nats-py's ``request``.

nats-py's ``request`` (and ``js.publish``, which is one) reads a random token from the OS, draws a second id
and wraps the wait in `asyncio.wait_for` — about a tenth of a busy process's CPU. Here a request names
``<prefix>.<token>`` as its reply subject, the answer resolves the future registered under that token, and a
deadline is an entry on the loop's `TickWheel` (no timer of its own). The server's "no responders" status
comes to the same subject. Subclasses say what an answer means (`_resolve`) and what "no responders" raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from plexus.runtime.ops._ticks import wheel_of

__all__ = ["REPEAT_S", "MultiplexedInbox"]

T = TypeVar("T")

#: How often a request that is safe to repeat is sent again while unanswered (`MultiplexedInbox.request`).
REPEAT_S = 1.0

#: The status NATS answers a publish with a reply subject when no subscription matches it (and the
#: connection asked for it, as nats-py's does).
_NO_RESPONDERS = "503"


class MultiplexedInbox(Generic[T]):
    """Futures by reply token, resolved by whatever arrives on ``<prefix>.<token>``."""

    #: What a future fails with when the server says nobody listens on the request's subject.
    no_responders: Callable[[], Exception] = ConnectionError

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self._pending: dict[str, asyncio.Future[T]] = {}
        self._subscribed = False
        self._sub: Subscription | None = None
        self._subscribing = asyncio.Lock()
        self._tokens = itertools.count()
        #: Requests to send again while unanswered: token -> (when next, subject, data, headers).
        self._repeatable: dict[str, tuple[float, str, bytes, dict[str, str] | None]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe (once; concurrent first callers share the subscription)."""
        if self._subscribed:
            return
        async with self._subscribing:
            if not self._subscribed:
                self._sub = await self.nc.subscribe(f"{self.prefix}.*", cb=self._on_message)
                self._subscribed = True

    def expect(self, token: str) -> tuple[str, asyncio.Future[T]]:
        """The reply subject for `token` (one subject token) and the future its answer resolves. However
        the future ends (answered, failed, cancelled), the token is no longer waited for."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending[token] = future

        def done(f: asyncio.Future[T]) -> None:
            if self._pending.get(token) is f:  # a later request may have reused the token
                del self._pending[token]
                self._repeatable.pop(token, None)

        future.add_done_callback(done)
        return f"{self.prefix}.{token}", future

    async def request(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        repeat: bool = False,
    ) -> asyncio.Future[T]:
        """Publish `data` to `subject` now, answered on a fresh token; the future holds the answer.

        `repeat`, for a request that is safe to repeat (a read; a publish the stream de-duplicates by its
        ``Nats-Msg-Id``; a fenced append): sent again every `REPEAT_S` until answered (the first answer
        counts). One sent while a stream elects its leader is never answered; a repeat after the election
        is, so the caller waits about as long as the election, not its whole timeout."""
        await self.start()
        token = str(next(self._tokens))
        reply, future = self.expect(token)
        try:
            await self.nc.publish(subject, data, reply=reply, headers=headers)
        except BaseException:
            future.cancel()
            raise
        if repeat:
            # One sweeper for all: a dict entry per request on the hot path, no timer of its own.
            self._repeatable[token] = (time.monotonic() + REPEAT_S, subject, data, headers)
            if self._sweeper is None:
                self._sweeper = asyncio.create_task(self._sweep(), name="inbox-repeats")
        return future

    async def _sweep(self) -> None:
        """Send again what is still unanswered `REPEAT_S` after it was last sent; ends when nothing is."""
        try:
            while self._repeatable:
                await asyncio.sleep(REPEAT_S / 4)
                now = time.monotonic()
                due = [(t, entry) for t, entry in self._repeatable.items() if entry[0] <= now]
                for token, (_, subject, data, headers) in due:
                    future = self._pending.get(token)
                    if token not in self._repeatable or future is None or future.done():
                        continue  # answered meanwhile
                    self._repeatable[token] = (now + REPEAT_S, subject, data, headers)
                    with contextlib.suppress(Exception):  # reconnecting: the next round covers it
                        await self.nc.publish(subject, data, reply=f"{self.prefix}.{token}", headers=headers)
        finally:
            self._sweeper = None

    @staticmethod
    async def answer(future: asyncio.Future[T], timeout: float, expired: Callable[[], Exception]) -> T:
        """The answer, or `expired()` raised after `timeout` seconds (up to one 10 ms tick later: the
        timeout is on the loop's `TickWheel`, not a timer of its own; the future is then done)."""
        if future.done():
            return future.result()
        expiry = _Expiry(future, expired)
        wheel = wheel_of(asyncio.get_running_loop())
        tick = wheel.arm(expiry, timeout)
        try:
            return await future
        finally:
            wheel.disarm(expiry, tick)

    def cancel_all(self) -> None:
        for future in list(self._pending.values()):
            future.cancel()
        self._repeatable.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def stop(self) -> None:
        """Cancel what is still awaited and unsubscribe (a later request subscribes again)."""
        self.cancel_all()
        async with self._subscribing:
            sub, self._sub, self._subscribed = self._sub, None, False
            if sub is not None:
                await sub.unsubscribe()

    async def _on_message(self, msg: Msg) -> None:
        future = self._pending.get(msg.subject.rpartition(".")[2])
        if future is None or future.done():
            return
        if not msg.data and msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            future.set_exception(self.no_responders())
            return
        self._resolve(msg, future)

    def _resolve(self, msg: Msg, future: asyncio.Future[T]) -> None:
        raise NotImplementedError


class _Expiry(Generic[T]):
    """An awaited answer's timeout, on the wheel."""

    __slots__ = ("expired", "future")

    def __init__(self, future: asyncio.Future[T], expired: Callable[[], Exception]) -> None:
        self.future = future
        self.expired = expired

    def expire(self) -> None:
        if not self.future.done():
            self.future.set_exception(self.expired())
