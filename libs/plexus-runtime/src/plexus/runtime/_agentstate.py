"""An agent's durable state in ONE JetStream write: its EventLog entries and its checkpoint, atomically.

The checkpoint of agent ``<type>/<key>`` is the single message on ``<prefix>.<ns>.evlog.<type>.<key>.ckpt``
in the ``PLEXUS_EVENTS`` stream (``Nats-Rollup: sub`` keeps only the newest). A commit is an atomic batch
(nats-server ≥ 2.12, ``allow_atomic``) of two messages — the EventLog batch on the agent's log subject, then
the checkpoint — each fenced by ``Nats-Expected-Last-Subject-Sequence``: the server stores both or neither,
and a writer whose view is stale (a zombie that lost its partition) gets `ConcurrentAppendError`. One round
trip instead of two serial writes (EventLog append, then a KV compare-and-swap).

Checkpoints written by earlier versions live in the ``plexus_checkpoints`` KV bucket; they are read when an
agent has no checkpoint message yet (migration), and the agent's next commit moves it here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from plexus.core import ConcurrentAppendError, KernelError

from ._artifacts import check_payload_size, headers_size
from ._checkpoints import Checkpoint, CheckpointStore
from ._eventlog import EventLog

__all__ = ["AgentStateStore", "CommitError"]

_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_EXPECTED_STREAM = "Nats-Expected-Stream"
_WRONG_LAST_SEQ = (10071, 10164)
#: Suffix token of an agent's checkpoint subject under its EventLog subject (keys are single tokens, so no
#: other agent's log subject can end with it).
CKPT_TOKEN = "ckpt"


class CommitError(KernelError):
    """The server refused a commit for a reason other than a stale sequence (retried by the worker)."""

    fields = ("code", "description")

    def __init__(self, code: int, description: str) -> None:
        self.code = code
        self.description = description
        super().__init__(f"commit refused ({code}): {description}")


class AgentStateStore:
    """Loads checkpoints and commits (EventLog entries + checkpoint) in one atomic batch."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        stream: str,
        legacy: CheckpointStore | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.legacy = legacy
        self.timeout = timeout

    @staticmethod
    def checkpoint_subject(log: EventLog[Any]) -> str:
        return f"{log.subject}.{CKPT_TOKEN}"

    async def load(self, log: EventLog[Any], legacy_key: str) -> tuple[Checkpoint | None, bool]:
        """(checkpoint, from_legacy): the newest checkpoint message, else a legacy KV checkpoint."""
        try:
            msg = await self.js.get_last_msg(self.stream, self.checkpoint_subject(log))
        except NotFoundError:
            if self.legacy is None:
                return None, False
            return await self.legacy.load(legacy_key), True
        return Checkpoint(state=msg.data or b"", revision=int(msg.seq or 0)), False

    async def commit(
        self,
        log: EventLog[Any],
        entries: Sequence[Any],
        expected_log_seq: int,
        checkpoint: bytes,
        expected_revision: int | None,
    ) -> tuple[int, int]:
        """Append `entries` and store `checkpoint` atomically; returns (new log seq, new revision)."""
        payload = log.encode_batch(entries)
        batch = uuid.uuid4().hex
        first = {
            "Nats-Batch-Id": batch,
            "Nats-Batch-Sequence": "1",
            _EXPECTED: str(expected_log_seq),
            _EXPECTED_STREAM: self.stream,
        }
        last = {
            "Nats-Batch-Id": batch,
            "Nats-Batch-Sequence": "2",
            "Nats-Batch-Commit": "1",
            _EXPECTED: str(expected_revision or 0),
            "Nats-Rollup": "sub",
        }
        limit = self.nc.max_payload
        check_payload_size(len(payload) + headers_size(first), limit)
        check_payload_size(len(checkpoint) + headers_size(last), limit)
        await self.nc.publish(log.subject, payload, headers=first)
        seq = await self._request(self.checkpoint_subject(log), checkpoint, last, expected_log_seq)
        # A batch is stored at consecutive sequences: the log entry right before the checkpoint.
        return seq - 1, seq

    async def save(self, log: EventLog[Any], checkpoint: bytes, expected_revision: int | None) -> int:
        """Store a checkpoint alone (``ctx.checkpoint()``); returns its revision."""
        headers = {
            _EXPECTED: str(expected_revision or 0),
            "Nats-Rollup": "sub",
            _EXPECTED_STREAM: self.stream,
        }
        check_payload_size(len(checkpoint) + headers_size(headers), self.nc.max_payload)
        return await self._request(self.checkpoint_subject(log), checkpoint, headers, expected_revision or 0)

    async def _request(self, subject: str, data: bytes, headers: dict[str, str], expected: int) -> int:
        msg = await self.nc.request(subject, data, headers=headers, timeout=self.timeout)
        try:
            answer = json.loads(msg.data)
        except ValueError:
            raise CommitError(0, f"unreadable answer {msg.data[:100]!r}") from None
        error = answer.get("error") if isinstance(answer, dict) else None
        if error:
            code = int(error.get("err_code", 0))
            if code in _WRONG_LAST_SEQ:
                # Another writer got there first: we are not (or no longer) this agent's owner.
                raise ConcurrentAppendError(expected, None)
            raise CommitError(code, str(error.get("description", "")))
        return int(answer["seq"])
