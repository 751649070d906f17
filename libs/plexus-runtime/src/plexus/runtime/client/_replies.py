"""The client's reply inbox: one wildcard subscription receives the answer to every message this client sends.

A send names ``<inbox>.<token>`` as its reply address (the NATS reply subject of a stateless type's core
publish, the envelope's ``reply_to`` of a durable one) and waits on a future keyed by the token, the
escaped message id. This is nats-py's request multiplexing without its per-request costs (a random token
read from the OS, a second id generator, `asyncio.wait_for`'s wrapper and timer): ≈ 15 % of a client's
CPU per call at 100 in flight. The server's "no responders" status for a core publish comes to the same
inbox and fails the send at once, as a request would.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from plexus.runtime.wire._envelope import Reply, decode_reply
from plexus.runtime.wire._subjects import escape_token

__all__ = ["NoRespondersError", "ReplyInbox"]

#: The status NATS answers a publish with a reply subject when no subscription matches it (and the
#: connection asked for it, as nats-py's does).
_NO_RESPONDERS = "503"


class NoRespondersError(Exception):
    """Nobody was subscribed to the subject a core message went to."""


class ReplyInbox:
    """Pending sends by token, resolved by the replies (or no-responders statuses) that arrive."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(f"{self.prefix}.*", cb=self._on_reply)

    def expect(self, message_id: str) -> tuple[str, asyncio.Future[Reply]]:
        """The reply address for `message_id` and the future its reply resolves; `forget` it when done."""
        # Message ids may hold '.', '*', '>': the reply subject gets the escaped id as ONE token.
        token = escape_token(message_id)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[token] = future
        return f"{self.prefix}.{token}", future

    def forget(self, message_id: str) -> None:
        self._pending.pop(escape_token(message_id), None)

    @staticmethod
    async def wait(future: asyncio.Future[Reply], timeout: float) -> Reply:
        """The reply, or TimeoutError after `timeout` seconds (NoRespondersError if nobody listened)."""
        timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()

    def cancel_all(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.cancel()

    async def _on_reply(self, msg: Msg) -> None:
        future = self._pending.get(msg.subject.rpartition(".")[2])
        if future is None or future.done():
            return
        if not msg.data and msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            future.set_exception(NoRespondersError(msg.subject))
            return
        try:
            reply = decode_reply(msg.data)
        except Exception:
            return  # not ours to interpret; the sender's deadline covers a lost reply
        future.set_result(reply)


def _expire(future: asyncio.Future[Reply]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
