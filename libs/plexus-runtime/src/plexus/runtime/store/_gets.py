"""A subject's last (or next) stored message, read from the stream's leader over the connection's multiplexed
inbox.

``js.get_last_msg`` (and a KV get, which is one) is a core request through nats-py: an OS random token, a
second id, a wrapper task and a timer per call, and a stream-name check — the larger part of the reads a new
activation makes (its checkpoint and its EventLog's last sequence) and of every budget check. `StreamGets`
sends the same ``STREAM.MSG.GET`` request (the leader answers, as nats-py's non-direct get does) on
`MultiplexedInbox` and returns what nats-py returns, or raises what it raises.
"""

from __future__ import annotations

import asyncio
import base64
import datetime

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api as js_api

from plexus.runtime.store._eventlog import GetLastMsg
from plexus.runtime.store._inbox import MultiplexedInbox

__all__ = ["StreamGets", "read_kv_entry"]

_API = "$JS.API"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode
#: The ``KV-Operation`` header values of a key's tombstones.
_REMOVED = frozenset({"DEL", "PURGE"})


class _NoResponders(Exception):
    """No JetStream answered (JetStream disabled or the API unreachable); raised as nats-py's error."""


class StreamGets(MultiplexedInbox[Msg]):
    """``js.get_last_msg`` over one subscription per connection (see the module docstring)."""

    no_responders = _NoResponders

    def __init__(self, nc: NATS, timeout_s: float = 5.0, api_prefix: str = _API) -> None:
        super().__init__(nc)
        self.timeout_s = timeout_s
        self._api = api_prefix

    async def get_last_msg(self, stream: str, subject: str) -> js_api.RawStreamMsg:
        """The last message stored on `subject` in `stream`: `js.get_last_msg`'s answer and errors
        (`NotFoundError` with err_code 10037 when there is none, `ServiceUnavailableError` when no JetStream
        answers, `nats.errors.TimeoutError`)."""
        return await self._get(stream, {"last_by_subj": subject})

    async def get_next_msg(self, stream: str, subject: str, seq: int) -> js_api.RawStreamMsg:
        """The first message stored on `subject` in `stream` at or after sequence `seq`: ``js.get_msg(...,
        next=True)``'s answer, with `get_last_msg`'s errors."""
        return await self._get(stream, {"seq": seq, "next_by_subj": subject})

    async def get_first_since(
        self, stream: str, subject: str, when: datetime.datetime
    ) -> js_api.RawStreamMsg:
        """The first message stored on `subject` in `stream` at or after time `when` (the server's store
        time), with `get_last_msg`'s errors."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return await self._get(stream, {"start_time": when.isoformat(), "next_by_subj": subject})

    async def _get(self, stream: str, request: dict[str, object]) -> js_api.RawStreamMsg:
        if not stream or any(c in stream for c in ". \t\r\n*>"):
            raise ValueError(f"invalid stream name {stream!r}")
        future = await self.request(
            f"{self._api}.STREAM.MSG.GET.{stream}",
            _encode(request),
            repeat=True,  # a read: asked again while a leader election swallows it
        )
        try:
            msg = await self.answer(future, self.timeout_s, nats.errors.TimeoutError)
        except _NoResponders:
            raise nats.js.errors.ServiceUnavailableError from None
        finally:
            future.cancel()  # no-op once answered
        return _stored_message(msg.data)

    async def kv_entry(self, bucket: str, key: str) -> js_api.RawStreamMsg | None:
        """The current entry of ``key`` in KV ``bucket`` (see `read_kv_entry`)."""
        return await read_kv_entry(self.get_last_msg, bucket, key)

    def _resolve(self, msg: Msg, future: asyncio.Future[Msg]) -> None:
        future.set_result(msg)


async def read_kv_entry(get_last_msg: GetLastMsg, bucket: str, key: str) -> js_api.RawStreamMsg | None:
    """The current entry of ``key`` in KV ``bucket`` as ``get_last_msg`` reads its stream (from the leader,
    what ``kv.get`` reads without direct gets; the revision is the message's ``seq``): None when the key
    (or the bucket) has none — never put, or its last operation deleted or purged it."""
    try:
        raw = await get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    except nats.js.errors.NotFoundError:
        return None
    if (raw.headers or {}).get("KV-Operation") in _REMOVED:
        return None
    return raw


def _stored_message(data: bytes) -> js_api.RawStreamMsg:
    response = _decode(data)
    if not isinstance(response, dict):
        raise nats.js.errors.Error(f"undecodable stream message response: {data[:64]!r}")
    if "error" in response:
        nats.js.errors.APIError.from_error(response["error"])  # raises the typed error it builds
    raw: js_api.RawStreamMsg = js_api.RawStreamMsg.from_response(response["message"])
    if raw.hdrs:
        raw.headers = _headers(base64.b64decode(raw.hdrs))
    raw.data = base64.b64decode(raw.data) if raw.data else None
    return raw


def _headers(block: bytes) -> dict[str, str] | None:
    """The headers of a stored ``NATS/1.0`` header block (its status line skipped)."""
    headers: dict[str, str] = {}
    for line in block.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name:
            headers[name.decode().strip()] = value.decode().strip()
    return headers or None
