"""JetStream publishes over one ack subscription per connection: sent now, in order with everything else the
connection sends; the ack is awaited at once (`publish_acked`, what ``js.publish`` does) or later, when the
caller needs the messages stored (`publish` + `wait`: the worker's progress events, when a handler returns).

nats-py's ``publish_async`` does the same but never completes its future when the server answers with an
API error (its reply handler raises instead), so a refused message would only show as a timeout. Its
``js.publish`` is a core request each time: a random token read from the OS, a second id generator and
`asyncio.wait_for`'s wrapper — a tenth of a durable worker's CPU, spent on the commit's one write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api as js_api

from plexus.runtime.store._artifacts import check_payload_size, headers_size
from plexus.runtime.store._inbox import MultiplexedInbox

__all__ = ["DeferredAcks"]

_MSG_ID = "Nats-Msg-Id"


class DeferredAcks(MultiplexedInbox[dict[str, Any]]):
    """One ack subscription per connection (`MultiplexedInbox`); `publish` returns the future of the
    message's ack, `publish_acked` awaits it."""

    no_responders = nats.js.errors.NoStreamResponseError

    def __init__(self, nc: NATS, timeout_s: float = 5.0) -> None:
        super().__init__(nc)
        self.timeout_s = timeout_s

    async def publish(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> asyncio.Future[dict[str, Any]]:
        """Publish `data` to a stream's `subject` now; the future holds the ack (or the publish's error)."""
        return await self.request(subject, data, headers)

    async def publish_acked(
        self,
        subject: str,
        data: bytes,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        repeat: bool | None = None,
    ) -> js_api.PubAck:
        """``js.publish``: the ack, or what it raises (`nats.errors.TimeoutError`, nats-py's typed API
        errors); `PayloadTooLargeError` before sending what the server would refuse with a disconnect.

        ``repeat``: send it again every `REPEAT_S` while unanswered (a leader election swallows it) — by
        default only with a `Nats-Msg-Id` (the stream keeps one copy); True for a publish the caller makes
        safe otherwise (a fenced EventLog append)."""
        check_payload_size(len(data) + headers_size(headers), self.nc.max_payload)
        if repeat is None:
            repeat = headers is not None and _MSG_ID in headers
        future = await self.request(subject, data, headers, repeat=repeat)
        try:
            answer = await self.answer(
                future, self.timeout_s if timeout is None else timeout, nats.errors.TimeoutError
            )
        finally:
            future.cancel()  # no-op once answered
        return js_api.PubAck.from_response(answer)

    async def wait(self, futures: Iterable[asyncio.Future[dict[str, Any]]]) -> None:
        """Wait for every ack, in order; the first error (or `nats.errors.TimeoutError`) is raised."""
        pending = list(futures)
        try:
            async with asyncio.timeout(self.timeout_s):
                for future in pending:
                    await future
        except TimeoutError:
            raise nats.errors.TimeoutError from None  # what an awaited js.publish raises: an outage
        finally:
            self.forget(pending)

    def forget(self, futures: Iterable[asyncio.Future[dict[str, Any]]]) -> None:
        """Stop waiting for these acks (done or not)."""
        for future in futures:
            future.cancel()

    def _resolve(self, msg: Msg, future: asyncio.Future[dict[str, Any]]) -> None:
        try:
            answer = msgspec.json.decode(msg.data)
            if not isinstance(answer, dict):
                raise ValueError(f"a JSON {type(answer).__name__}, not an object")
            error = answer.get("error")
        except Exception as exc:
            future.set_exception(nats.js.errors.Error(f"undecodable publish ack: {exc}"))
            return
        if error is None:
            future.set_result(answer)
            return
        try:  # nats-py's from_error raises the typed error it builds
            nats.js.errors.APIError.from_error(error)
        except nats.js.errors.Error as typed:
            future.set_exception(typed)
        except Exception:  # an error object of another shape
            future.set_exception(nats.js.errors.APIError(description=str(error)))
