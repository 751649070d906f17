"""The client's reply inbox: one wildcard subscription receives the answer to every message this client sends.

A send names ``<inbox>.<token>`` as its reply address (the NATS reply subject of a stateless type's core
publish, the envelope's ``reply_to`` of a durable one) and waits on a future keyed by the token, the
escaped message id (`MultiplexedInbox`). The server's "no responders" status for a core publish fails the
send at once, as a request would.
"""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from plexus.runtime.store._inbox import MultiplexedInbox
from plexus.runtime.wire._envelope import Reply, decode_reply
from plexus.runtime.wire._subjects import escape_token

__all__ = ["NoRespondersError", "ReplyInbox"]


class NoRespondersError(Exception):
    """Nobody was subscribed to the subject a core message went to."""


class ReplyInbox(MultiplexedInbox[Reply]):
    """Pending sends by message id, resolved by the replies (or no-responders statuses) that arrive."""

    no_responders = NoRespondersError

    def expect_reply(self, message_id: str) -> tuple[str, asyncio.Future[Reply]]:
        """The reply address for `message_id` and the future its reply resolves."""
        # Message ids may hold '.', '*', '>': the reply subject gets the escaped id as ONE token.
        return self.expect(escape_token(message_id))

    def _resolve(self, msg: Msg, future: asyncio.Future[Reply]) -> None:
        try:
            reply = decode_reply(msg.data)
        except Exception:
            return  # not ours to interpret; the sender's deadline covers a lost reply
        future.set_result(reply)
