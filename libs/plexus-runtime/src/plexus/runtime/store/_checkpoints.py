"""Agent checkpoints in the ``plexus_checkpoints`` KV bucket, written by compare-and-swap on the revision.

The revision a worker loaded is its fencing token: a save names it, and the server refuses the write when
another worker saved in between. A zombie (a worker that lost its partition but is still running a handler)
therefore cannot overwrite the state of the new owner; it gets `CheckpointConflictError` instead.

Large state: a checkpoint is one KV message, so state plus headers must fit in the server's
``max_payload`` (1 MiB by default). An oversized save raises `PayloadTooLargeError` before anything is sent
(the server would otherwise close the connection). Keep big data out of the state: put it in the
`ArtifactStore` and keep the artifact id in the checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from plexus.core import KernelError

from ._artifacts import check_payload_size, headers_size, max_payload_of
from ._eventlog import GetLastMsg
from ._gets import read_kv_entry

__all__ = ["DEFAULT_CHECKPOINTS_BUCKET", "Checkpoint", "CheckpointConflictError", "CheckpointStore"]

DEFAULT_CHECKPOINTS_BUCKET = "plexus_checkpoints"

_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")  # what the KV API accepts as a key
_WRONG_LAST_SEQ_CODES = (10071, 10164)
_EXPECTED_HEADER = "Nats-Expected-Last-Subject-Sequence"


class CheckpointConflictError(KernelError):
    """A checkpoint changed since it was loaded: the caller is no longer the owner of this state.

    ``actual_revision`` is the revision found after the conflict (None when the key does not exist).
    """

    fields = ("key", "expected_revision", "actual_revision")

    def __init__(self, key: str, expected_revision: int | None, actual_revision: int | None) -> None:
        self.key = key
        self.expected_revision = expected_revision
        self.actual_revision = actual_revision
        expected = "absent" if not expected_revision else f"revision {expected_revision}"
        actual = "absent" if actual_revision is None else f"revision {actual_revision}"
        super().__init__(f"Checkpoint {key!r} conflict: expected {expected}, found {actual}")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A stored state and its revision (the token for the next compare-and-swap save)."""

    state: bytes
    revision: int


class CheckpointStore:
    """Compare-and-swap access to checkpoints in a KV bucket."""

    def __init__(
        self, kv: KeyValue, *, bucket: str | None = None, get_last_msg: GetLastMsg | None = None
    ) -> None:
        """``get_last_msg`` (with the ``bucket``'s name): how `load` reads, instead of ``kv.get`` (the
        runtime passes its connection's multiplexed reads; both read the stream's leader)."""
        self._kv = kv
        self._reads = (bucket, get_last_msg) if bucket is not None and get_last_msg is not None else None

    async def load(self, key: str) -> Checkpoint | None:
        """The current checkpoint of ``key``, or None when there is none (never saved or deleted)."""
        _check_key(key)
        if self._reads is not None:
            msg = await read_kv_entry(self._reads[1], self._reads[0], key)
            if msg is None:
                return None
            return Checkpoint(state=msg.data or b"", revision=msg.seq or 0)
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return None
        return Checkpoint(state=entry.value or b"", revision=entry.revision or 0)

    async def save(self, key: str, state: bytes, expected_revision: int | None) -> int:
        """Store ``state`` if the current revision is ``expected_revision`` and return the new revision.

        ``expected_revision`` None or 0 means the key must not exist. Raises `CheckpointConflictError` on a
        mismatch and `PayloadTooLargeError` when the state does not fit in one message.
        """
        _check_key(key)
        if expected_revision is not None and expected_revision < 0:
            raise ValueError(f"expected_revision must be >= 0 or None, got {expected_revision}")
        overhead = headers_size({_EXPECTED_HEADER: str(expected_revision or 0)})
        check_payload_size(len(state) + overhead, max_payload_of(self._kv))
        try:
            if not expected_revision:
                return await self._kv.create(key, state)
            return await self._kv.update(key, state, last=expected_revision)
        except KeyWrongLastSequenceError:
            raise await self._conflict(key, expected_revision) from None

    async def delete(self, key: str, expected_revision: int | None) -> None:
        """Delete ``key`` if its revision is ``expected_revision`` (None: unconditionally)."""
        _check_key(key)
        try:
            await self._kv.delete(key, last=expected_revision)
        except APIError as exc:
            # kv.delete does not translate a failed expectation like create/update do.
            if exc.err_code not in _WRONG_LAST_SEQ_CODES:
                raise
            raise await self._conflict(key, expected_revision) from None

    async def _conflict(self, key: str, expected_revision: int | None) -> CheckpointConflictError:
        current = await self.load(key)
        return CheckpointConflictError(key, expected_revision, None if current is None else current.revision)


def _check_key(key: str) -> None:
    if not _KEY_RE.fullmatch(key) or key.startswith(".") or key.endswith("."):
        raise ValueError(f"invalid checkpoint key {key!r}: use [-/_=.a-zA-Z0-9], no leading/trailing '.'")
