"""`RunStore`: the run tree in the `plexus_runs` KV bucket, changed only by compare-and-swap.

Every change is read → mutate → ``update(last=revision)``; a conflict (another replica or request got there
first) re-reads and re-applies the mutation, so concurrent writers never lose each other's changes and
no replica needs to hold state in memory. Mutations are plain functions of the current record: they
decide from what is stored, not from what the caller saw earlier.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from plexus.runtime.kernel import StreamGets, escape_token
from plexus.runtime.orchestration import (
    RunNotFoundError,
    RunRecord,
    TreeRecord,
    input_key,
    run_key,
    tree_key,
)

__all__ = ["CasConflictError", "Changed", "RunStore"]

#: JetStream's "wrong last sequence" error codes (JSStreamWrongLastSequenceErrF, …ConstantErr). nats-py maps
#: them to KeyWrongLastSequenceError for ``update``/``create`` but not for ``delete(last=…)``, which raises
#: the bare BadRequestError.
_WRONG_LAST_SEQUENCE = frozenset({10071, 10164})

S = TypeVar("S", RunRecord, TreeRecord)

_ENCODER = msgspec.json.Encoder()
_RUN_DECODER = msgspec.json.Decoder(RunRecord)
_TREE_DECODER = msgspec.json.Decoder(TreeRecord)


class CasConflictError(RuntimeError):
    """A record kept changing under us for every attempt (pathological contention)."""


@dataclass(frozen=True, slots=True)
class Changed(Generic[S]):
    """The outcome of a CAS mutation: the stored record afterwards and whether this call wrote it."""

    record: S
    revision: int
    written: bool


def run_kv_key(run_id: str) -> str:
    return run_key(escape_token(run_id))


def tree_kv_key(root_id: str) -> str:
    return tree_key(escape_token(root_id))


class RunStore:
    """Typed, CAS-only access to `plexus_runs`. ``attempts`` bounds the retries of one mutation.

    ``gets``: reads go through it (the connection's multiplexed inbox, from the stream's leader as
    ``kv.get`` reads them) instead of nats-py's ``kv.get``, whose request machinery and header parsing were
    the larger part of a replica's CPU; ``bucket`` names the KV bucket for it."""

    def __init__(
        self, kv: KeyValue, *, attempts: int = 50, gets: StreamGets | None = None, bucket: str = ""
    ) -> None:
        if gets is not None and not bucket:
            raise ValueError("reading through StreamGets needs the bucket's name")
        self.kv = kv
        self.attempts = attempts
        self.gets = gets
        self.bucket = bucket

    # -- runs -----------------------------------------------------------------------------------------
    async def get_run(self, run_id: str) -> tuple[RunRecord, int] | None:
        return await self._get(run_kv_key(run_id), _RUN_DECODER)

    async def require_run(self, run_id: str) -> tuple[RunRecord, int]:
        found = await self.get_run(run_id)
        if found is None:
            raise RunNotFoundError(run_id)
        return found

    async def create_run(self, record: RunRecord) -> int | None:
        """Store a new run; None when a run with this id already exists."""
        return await self._create(run_kv_key(record.run_id), record)

    async def update_run(
        self,
        run_id: str,
        mutate: Callable[[RunRecord], bool],
        known: tuple[RunRecord, int] | None = None,
    ) -> Changed[RunRecord]:
        """Apply ``mutate`` (in place; returns whether to write) by CAS. Raises RunNotFoundError.

        ``known``: the record and revision the caller just wrote or read; the first attempt starts from a
        copy of it instead of reading (a stale one costs one conflict and a re-read)."""
        return await self._update(
            run_kv_key(run_id), _RUN_DECODER, mutate, lambda: RunNotFoundError(run_id), known
        )

    async def delete_run(self, run_id: str, revision: int) -> bool:
        """Delete a run only if it is still at ``revision`` (a spawn that was never admitted)."""
        try:
            await self.kv.delete(run_kv_key(run_id), last=revision)
        except KeyWrongLastSequenceError:
            return False
        except APIError as err:
            if err.err_code in _WRONG_LAST_SEQUENCE:
                return False  # the run changed meanwhile (another request admitted it): keep it
            raise
        return True

    # -- trees ----------------------------------------------------------------------------------------
    async def get_tree(self, root_id: str) -> tuple[TreeRecord, int] | None:
        return await self._get(tree_kv_key(root_id), _TREE_DECODER)

    async def create_tree(self, tree: TreeRecord) -> int | None:
        return await self._create(tree_kv_key(tree.root_id), tree)

    async def update_tree(
        self,
        root_id: str,
        mutate: Callable[[TreeRecord], bool],
        known: tuple[TreeRecord, int] | None = None,
    ) -> Changed[TreeRecord]:
        """`update_run` for the tree of ``root_id``."""
        return await self._update(
            tree_kv_key(root_id), _TREE_DECODER, mutate, lambda: RunNotFoundError(root_id), known
        )

    # -- inputs ---------------------------------------------------------------------------------------
    async def put_input(self, run_id: str, payload: bytes) -> None:
        # Written before the run record, and only once per id: a repeated start re-puts the same bytes.
        await self.kv.put(input_key(escape_token(run_id)), payload)

    async def get_input(self, run_id: str) -> bytes | None:
        found = await self._read(input_key(escape_token(run_id)))
        return found[0] if found is not None else None

    # -- internals ------------------------------------------------------------------------------------
    async def _read(self, key: str) -> tuple[bytes | None, int] | None:
        """The key's value and revision; None when it has none (never put, deleted or purged)."""
        if self.gets is not None:
            raw = await self.gets.kv_entry(self.bucket, key)
            return None if raw is None else (raw.data or b"", int(raw.seq or 0))
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return None
        return entry.value, int(entry.revision or 0)

    async def _get(self, key: str, decoder: msgspec.json.Decoder[S]) -> tuple[S, int] | None:
        found = await self._read(key)
        if found is None or not found[0]:
            return None
        return decoder.decode(found[0]), found[1]

    async def _create(self, key: str, record: RunRecord | TreeRecord) -> int | None:
        try:
            return await self.kv.create(key, _ENCODER.encode(record))
        except KeyWrongLastSequenceError:
            return None

    async def _update(
        self,
        key: str,
        decoder: msgspec.json.Decoder[S],
        mutate: Callable[[S], bool],
        missing: Callable[[], Exception],
        known: tuple[S, int] | None = None,
    ) -> Changed[S]:
        for attempt in range(self.attempts):
            if known is not None:
                # A deep copy: `mutate` works in place (lists included) and must not touch the caller's.
                found: tuple[S, int] | None = (decoder.decode(_ENCODER.encode(known[0])), known[1])
                known = None
            else:
                found = await self._get(key, decoder)
            if found is None:
                raise missing()
            record, revision = found
            if not mutate(record):
                return Changed(record, revision, written=False)
            try:
                new_revision = await self.kv.update(key, _ENCODER.encode(record), last=revision)
            except KeyWrongLastSequenceError:
                # Jittered so two replicas racing on one hot tree do not keep colliding in lockstep.
                await asyncio.sleep(random.uniform(0, 0.002 * (attempt + 1)))
                continue
            return Changed(record, new_revision, written=True)
        raise CasConflictError(f"{key}: still conflicting after {self.attempts} attempts")


def encode_record(record: RunRecord | TreeRecord) -> bytes:
    return _ENCODER.encode(record)


def decode_run(data: bytes) -> RunRecord:
    return _RUN_DECODER.decode(data)


def decode_tree(data: bytes) -> TreeRecord:
    return _TREE_DECODER.decode(data)
