"""The per-agent EventLog (seed 000): an append-only log on one subject of the ``PLEXUS_EVENTS`` stream.

An append of several entries is ONE JetStream message whose body is a JSON array of the encoded entries,
published with ``Nats-Expected-Last-Subject-Sequence``: the server stores all of them or none, and a writer
whose view of the log is stale gets `ConcurrentAppendError` instead of interleaving with another writer
(seed 000: "fences concurrent writes without a distributed lock").

Sequences are JetStream *stream* sequences of the batch messages, so one agent's sequences grow but are not
contiguous (other agents share the stream). A `LogRecord` is addressed by ``(seq, index)``: the batch and the
entry's position inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import os
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Protocol, TypeVar, overload

import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, PubAck, RawStreamMsg
from nats.js.errors import APIError, NotFoundError

from plexus.core import ConcurrentAppendError, KernelMessage, UnknownMessage, entry_from_json, entry_to_json

from ._artifacts import safe_publish

__all__ = [
    "DEFAULT_EVENTS_STREAM",
    "EventLog",
    "EventLogEntry",
    "GetFirstSince",
    "GetLastMsg",
    "GetNextMsg",
    "LogRecord",
    "LogTail",
    "Publish",
]

T = TypeVar("T")

DEFAULT_EVENTS_STREAM = "PLEXUS_EVENTS"
EventLogEntry = KernelMessage | UnknownMessage
"""The default entry type: kernel messages and run events of `plexus.core._messages`."""

_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
_EXPECTED_STREAM = "Nats-Expected-Stream"
_MSG_ID = "Nats-Msg-Id"
#: Header naming one append (all its copies): a repeat whose first copy landed recognises it as its own. Not a
#: `Nats-Msg-Id`: the stream would keep every id for its dedupe window, a memory cost per message.
_APPEND_ID = "Plexus-Append"
_APPEND_ID_PREFIX = os.urandom(6).hex() + "-"
_APPEND_IDS = itertools.count()
# 10071: "wrong last sequence: N"; 10164: the same check failing without a number (batch/in-flight cases).
_WRONG_LAST_SEQ_CODES = (10071, 10164)
_NO_MESSAGE_FOUND = 10037
#: Batches a `read` fetches by single requests before it reads the rest through an ordered consumer.
_GETS_PER_READ = 32
_WRONG_LAST_SEQ_RE = re.compile(r"wrong last sequence:\s*(\d+)")
_RAW_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])


@dataclass(frozen=True, slots=True)
class LogRecord(Generic[T]):
    """One entry of the log: the batch's stream sequence, the entry's index inside the batch, the entry."""

    seq: int
    index: int
    entry: T


class Publish(Protocol):
    """How an append reaches the stream: ``js.publish``'s contract (the PubAck, or its errors). ``repeat``:
    the append may be sent again while unanswered (it is fenced, and recognised by its content, below)."""

    def __call__(
        self,
        subject: str,
        data: bytes,
        *,
        headers: dict[str, str] | None = ...,
        timeout: float | None = ...,
        repeat: bool | None = ...,
    ) -> Awaitable[PubAck]: ...


class GetLastMsg(Protocol):
    """How the log's last batch is read: ``js.get_last_msg``'s contract (the message, or its errors)."""

    def __call__(self, stream: str, subject: str) -> Awaitable[RawStreamMsg]: ...


class GetNextMsg(Protocol):
    """How a read steps through the log: ``js.get_msg(stream, seq=seq, subject=subject, next=True)``'s
    contract (the first message on the subject at or after ``seq``, or its errors)."""

    def __call__(self, stream: str, subject: str, seq: int) -> Awaitable[RawStreamMsg]: ...


class GetFirstSince(Protocol):
    """How `read_since` finds where to start: the first message on the subject stored at or after ``when``
    (``STREAM.MSG.GET`` with ``start_time``), or its errors."""

    def __call__(self, stream: str, subject: str, when: datetime.datetime) -> Awaitable[RawStreamMsg]: ...


class EventLog(Generic[T]):
    """The EventLog of one agent: ``subject`` in ``stream``, entries converted by ``encode``/``decode``.

    ``encode`` must return one JSON value as bytes (entries are packed into a JSON array); the default
    codec is `entry_to_json` / `entry_from_json`. ``timeout`` bounds every server round trip and, in
    `read`, the wait for the next stored message. ``publish`` sends an append (default: ``js.publish``;
    the runtime passes its connection's one multiplexed publisher), with ``js.publish``'s errors;
    ``get_last_msg`` reads the last batch and ``get_next_msg`` the next one of a short `read` (defaults:
    ``js.get_last_msg``, ``js.get_msg``; the runtime passes its connection's); ``get_first_since`` finds where
    `read_since` starts (without it, `read_since` reads through an ordered consumer).
    """

    @overload
    def __init__(
        self: EventLog[EventLogEntry],
        js: JetStreamContext,
        subject: str,
        *,
        stream: str = ...,
        encode: None = None,
        decode: None = None,
        timeout: float = ...,
        publish: Publish | None = ...,
        get_last_msg: GetLastMsg | None = ...,
        get_next_msg: GetNextMsg | None = ...,
        get_first_since: GetFirstSince | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self,
        js: JetStreamContext,
        subject: str,
        *,
        stream: str = ...,
        encode: Callable[[T], bytes],
        decode: Callable[[bytes], T],
        timeout: float = ...,
        publish: Publish | None = ...,
        get_last_msg: GetLastMsg | None = ...,
        get_next_msg: GetNextMsg | None = ...,
        get_first_since: GetFirstSince | None = ...,
    ) -> None: ...

    def __init__(
        self,
        js: JetStreamContext,
        subject: str,
        *,
        stream: str = DEFAULT_EVENTS_STREAM,
        encode: Callable[[T], bytes] | None = None,
        decode: Callable[[bytes], T] | None = None,
        timeout: float = 5.0,
        publish: Publish | None = None,
        get_last_msg: GetLastMsg | None = None,
        get_next_msg: GetNextMsg | None = None,
        get_first_since: GetFirstSince | None = None,
    ) -> None:
        if not subject or any(c in subject for c in " \t\r\n*>"):
            raise ValueError(f"EventLog subject must be a literal subject without wildcards, got {subject!r}")
        if (encode is None) != (decode is None):
            raise ValueError("give both encode and decode, or neither for the default entry codec")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self._js = js
        self.subject = subject
        self.stream = stream
        # The overloads tie T to EventLogEntry exactly when the default codec is used.
        self._encode: Callable[[T], bytes] = encode if encode is not None else entry_to_json  # type: ignore[assignment]
        self._decode: Callable[[bytes], T] = decode if decode is not None else entry_from_json  # type: ignore[assignment]
        self._timeout = timeout
        self._publish = publish
        self._get_last_msg: GetLastMsg = get_last_msg or self._js_get_last_msg
        self._get_next_msg: GetNextMsg = get_next_msg or self._js_get_next_msg
        self._get_first_since = get_first_since

    # -- writing -------------------------------------------------------------------------------------
    async def append(
        self,
        entries: Sequence[T],
        expected_seq: int,
        *,
        msg_id: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Append ``entries`` atomically if the log's last sequence is ``expected_seq`` (0: log is empty).

        Returns the new last sequence. Raises `ConcurrentAppendError` when another writer got there first,
        and `PayloadTooLargeError` when the batch does not fit in one message. With ``msg_id``, retrying an
        append whose first attempt landed (e.g. after a timeout) returns that attempt's sequence.
        ``timeout`` (at most the log's own, its default): how long the append is sent again while
        unanswered, then `nats.errors.TimeoutError`; a writer whose right to write ends at a known time (a
        lease) passes what is left of it.
        """
        return await self._append_batch(self.encode_batch(entries), expected_seq, msg_id, timeout)

    async def append_encoded(
        self,
        encoded: Sequence[bytes],
        expected_seq: int,
        *,
        msg_id: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """`append` for entries already encoded as this log's ``encode`` would (one JSON value each)."""
        if not encoded:
            raise ValueError("append needs at least one entry")
        return await self._append_batch(b"[" + b",".join(encoded) + b"]", expected_seq, msg_id, timeout)

    async def _append_batch(
        self, payload: bytes, expected_seq: int, msg_id: str | None, timeout: float | None = None
    ) -> int:
        if expected_seq < 0:
            raise ValueError(f"expected_seq must be >= 0, got {expected_seq}")
        if timeout is None:
            timeout = self._timeout
        elif timeout > 0:
            timeout = min(timeout, self._timeout)
        else:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        headers = {_EXPECTED_LAST_SUBJECT_SEQ: str(expected_seq), _EXPECTED_STREAM: self.stream}
        if msg_id is not None:
            headers[_MSG_ID] = msg_id
        append_id = None
        try:
            if self._publish is not None:
                # Sent again while unanswered (a leader election swallows it): a copy after one that landed
                # fails the fence and is recognised as ours by its append id, so it is never stored twice.
                headers[_APPEND_ID] = append_id = f"{_APPEND_ID_PREFIX}{next(_APPEND_IDS)}"
                ack = await self._publish(
                    self.subject, payload, headers=headers, timeout=timeout, repeat=True
                )
            else:
                ack = await safe_publish(
                    self._js, self.subject, payload, headers=headers, ack_timeout=timeout
                )
        except APIError as exc:
            if exc.err_code not in _WRONG_LAST_SEQ_CODES:
                raise
            actual = _parse_actual_seq(exc.description)
            if msg_id is not None or append_id is not None:
                landed = await self._seq_if_last_is(msg_id, append_id)
                if landed is not None:
                    return landed
            if actual is None:
                actual = await self.last_seq()
            raise ConcurrentAppendError(expected_seq, actual) from None
        return ack.seq

    def encode_batch(self, entries: Sequence[T]) -> bytes:
        """The stored form of one append: a JSON array of the encoded entries (at least one)."""
        if not entries:
            raise ValueError("append needs at least one entry")
        return b"[" + b",".join(self._encode(entry) for entry in entries) + b"]"

    async def append_with_retry(
        self, build: Callable[[int], Sequence[T]], attempts: int = 5, *, expected: int | None = None
    ) -> int:
        """Append ``build(last_seq)``, rebuilding against the new last sequence after a conflict.

        ``build`` sees the sequence its entries will follow, so it can re-derive them from the log. An
        empty build appends nothing and returns the current last sequence. After ``attempts`` conflicts the
        last `ConcurrentAppendError` propagates. ``expected``: a guess of the last sequence (one the caller
        saw last time): the first attempt uses it instead of reading, and a wrong guess costs one conflict.
        """
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        if expected is None:
            expected = await self.last_seq()
        for attempt in range(attempts):
            entries = build(expected)
            if not entries:
                return expected
            try:
                return await self.append(entries, expected)
            except ConcurrentAppendError as exc:
                if attempt == attempts - 1:
                    raise
                expected = exc.actual_seq if exc.actual_seq is not None else await self.last_seq()
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    # -- reading -------------------------------------------------------------------------------------
    async def last_seq(self) -> int:
        """The stream sequence of the log's last batch; 0 when the log is empty."""
        try:
            msg = await self._get_last_msg(self.stream, self.subject)
        except NotFoundError as exc:
            if exc.err_code == _NO_MESSAGE_FOUND:
                return 0
            raise  # e.g. the stream itself is missing: a topology problem, not an empty log
        return int(msg.seq or 0)

    async def read(self, from_seq: int = 0, to_seq: int | None = None) -> list[LogRecord[T]]:
        """Records of the batches with ``from_seq <= seq <= to_seq``; ``to_seq`` defaults to the last
        sequence at call time, so the call completes even while writers keep appending."""
        last = await self.last_seq()
        stop = last if to_seq is None else min(to_seq, last)
        return await self._read_range(max(from_seq, 1), stop)

    async def _read_range(self, start: int, stop: int) -> list[LogRecord[T]]:
        if stop < start:
            return []
        records: list[LogRecord[T]] = []
        # A few batches (an activation's replay since its checkpoint: 16 or fewer) are read one request each:
        # an ordered consumer per read is server state that outlives the read by its inactivity threshold,
        # and a burst of activations of known keys ran the events stream out of consumers.
        for _ in range(_GETS_PER_READ):
            try:
                msg = await self._get_next_msg(self.stream, self.subject, start)
            except NotFoundError as exc:
                if exc.err_code == _NO_MESSAGE_FOUND:
                    return records  # nothing at or after `start` (deleted meanwhile)
                raise
            seq = int(msg.seq or 0)
            if seq > stop:
                return records
            records.extend(self._records(seq, msg.data or b""))
            if seq >= stop:
                return records
            start = seq + 1
        return records + await self._read_by_consumer(await self._subscribe(start), stop)

    async def _read_by_consumer(
        self, sub: JetStreamContext.PushSubscription, stop: int
    ) -> list[LogRecord[T]]:
        records: list[LogRecord[T]] = []
        try:
            while True:
                msg = await sub.next_msg(timeout=self._timeout)
                meta = msg.metadata
                seq = meta.sequence.stream
                if seq > stop:
                    break
                records.extend(self._records(seq, msg.data))
                # num_pending == 0: nothing further is stored (e.g. the last batch was deleted meanwhile).
                if seq >= stop or meta.num_pending == 0:
                    break
        finally:
            await _unsubscribe(sub)
        return records

    async def read_since(self, when: datetime.datetime) -> list[LogRecord[T]]:
        """Records of the batches stored at or after `when` (up to the last one at call time): a short read
        when `when` is recent, however long the log is.

        "Nothing since `when`" is read from the last batch's timestamp, never concluded from a consumer that
        stays silent: one whose delivery stalls (its server lost, a leader elected meanwhile) raises
        `nats.errors.TimeoutError` after ``timeout``, as an outage, instead of answering a short list (a
        redelivered message would then look uncommitted and run twice)."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)  # nats-py reads a naive time as UTC too
        try:
            last_msg = await self._get_last_msg(self.stream, self.subject)
        except NotFoundError as exc:
            if exc.err_code == _NO_MESSAGE_FOUND:
                return []
            raise
        last = int(last_msg.seq or 0)
        if last == 0 or (last_msg.time is not None and last_msg.time < when):
            return []
        if self._get_first_since is not None:
            # No consumer (see `read`): a takeover with a backlog asks this for every message it inherits.
            try:
                start = int((await self._get_first_since(self.stream, self.subject, when)).seq or 0)
            except NotFoundError as exc:
                if exc.err_code != _NO_MESSAGE_FOUND:
                    raise
                start = last  # the last batch is stored since `when`: never conclude "nothing" against it
            return await self._read_range(start, last)
        sub = await self._js.subscribe(
            self.subject,
            stream=self.stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_TIME,
            config=ConsumerConfig(opt_start_time=when, inactive_threshold=5.0),
        )
        return await self._read_by_consumer(sub, last)

    def tail(self, from_seq: int = 0) -> LogTail[T]:
        """Stored records from ``from_seq`` on, then live ones as they are appended; never ends by itself.

        Use ``async with log.tail(n) as records: async for r in records: ...`` or call ``aclose()``; the
        subscription is also removed when the waiting task is cancelled.
        """
        return LogTail(self, max(from_seq, 1))

    # -- internals -----------------------------------------------------------------------------------
    async def _js_get_last_msg(self, stream: str, subject: str) -> RawStreamMsg:
        return await self._js.get_last_msg(stream, subject)

    async def _js_get_next_msg(self, stream: str, subject: str, seq: int) -> RawStreamMsg:
        return await self._js.get_msg(stream, seq=seq, subject=subject, next=True)

    async def _subscribe(self, start: int) -> JetStreamContext.PushSubscription:
        config = ConsumerConfig(opt_start_seq=start)
        return await self._js.subscribe(
            self.subject,
            stream=self.stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            config=config,
        )

    def _records(self, seq: int, data: bytes) -> list[LogRecord[T]]:
        try:
            raw_entries = _RAW_ARRAY.decode(data)
        except msgspec.DecodeError as exc:
            raise ValueError(f"EventLog {self.subject} seq {seq} is not a JSON array: {exc}") from None
        return [LogRecord(seq, i, self._decode(bytes(raw))) for i, raw in enumerate(raw_entries)]

    async def _seq_if_last_is(self, msg_id: str | None, append_id: str | None) -> int | None:
        """The sequence of the log's last batch when it is this append (an earlier attempt or a copy of it
        landed): the same `msg_id`, or the same `append_id`."""
        try:
            msg = await self._get_last_msg(self.stream, self.subject)
        except NotFoundError:
            return None
        headers = msg.headers or {}
        ours = (msg_id is not None and headers.get(_MSG_ID) == msg_id) or (
            append_id is not None and headers.get(_APPEND_ID) == append_id
        )
        return int(msg.seq or 0) if ours else None


class LogTail(Generic[T]):
    """Async iterator over an EventLog's records, stored then live (see `EventLog.tail`)."""

    def __init__(self, log: EventLog[T], start: int) -> None:
        self._log = log
        self._start = start
        self._sub: JetStreamContext.PushSubscription | None = None
        self._buffer: deque[LogRecord[T]] = deque()
        self._closed = False

    def __aiter__(self) -> AsyncIterator[LogRecord[T]]:
        return self

    async def __anext__(self) -> LogRecord[T]:
        if self._closed:
            raise StopAsyncIteration
        try:
            while not self._buffer:
                if self._sub is None:
                    self._sub = await self._log._subscribe(self._start)
                # No deadline on purpose: a tail waits for the next append until it is closed or cancelled.
                msg = await self._sub.next_msg(timeout=None)
                self._buffer.extend(self._log._records(msg.metadata.sequence.stream, msg.data))
        except asyncio.CancelledError:
            await self.aclose()
            raise
        return self._buffer.popleft()

    async def aclose(self) -> None:
        """Stop the tail and remove its subscription (idempotent)."""
        self._closed = True
        sub, self._sub = self._sub, None
        if sub is not None:
            await _unsubscribe(sub)

    async def __aenter__(self) -> LogTail[T]:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def _unsubscribe(sub: JetStreamContext.PushSubscription) -> None:
    # The ephemeral consumer is removed by the server once interest is gone; a closed connection already
    # dropped the subscription, so there is nothing left to clean up then.
    with contextlib.suppress(nats.errors.Error):
        await sub.unsubscribe()


def _parse_actual_seq(description: str | None) -> int | None:
    match = _WRONG_LAST_SEQ_RE.search(description or "")
    return int(match.group(1)) if match else None
