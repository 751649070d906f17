"""Artifacts (seed 002 DataRef handles) over the JetStream object store, and payload-size guards.

Media blocks whose inline ``data`` is larger than the inline limit travel as handles: the bytes go into the
``plexus_artifacts`` object store under their SHA-256 (so storing is idempotent and equal data is stored once)
and the block is replaced by a copy with ``data=None, file_id="art_<sha256>"``. `ArtifactStore.resolve`
loads the bytes back on demand.

`safe_publish` checks a payload plus its headers against the server's ``max_payload`` *before* sending: the
server answers an oversized message by closing the connection, which is far worse than a typed error.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import overload

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectMetaOptions, PubAck
from nats.js.errors import ObjectNotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from plexus.core import BaseBlock, KernelError, MediaBlock, ToolResultBlock

__all__ = [
    "ARTIFACT_ID_PREFIX",
    "DEFAULT_INLINE_LIMIT",
    "ArtifactNotFoundError",
    "ArtifactStore",
    "PayloadTooLargeError",
    "artifact_id_for",
    "check_payload_size",
    "headers_size",
    "is_artifact_id",
    "max_payload_of",
    "safe_publish",
]

DEFAULT_INLINE_LIMIT = 64 * 1024
ARTIFACT_ID_PREFIX = "art_"
# nats-py's object store default chunk; smaller servers get chunks of their max_payload instead.
_DEFAULT_CHUNK = 128 * 1024
# When a block already carried a (foreign) file_id, offloading must not lose it: it is kept here and restored.
_ORIGINAL_FILE_ID_KEY = "plexus.original_file_id"
_ARTIFACT_ID_RE = re.compile(r"art_[0-9a-f]{64}")
# Length of the "NATS/1.0\r\n" status line plus the blank line that ends a header block.
_HEADER_FRAMING = len(b"NATS/1.0\r\n") + len(b"\r\n")


class PayloadTooLargeError(KernelError):
    """A message (payload plus headers) is larger than the server's ``max_payload``."""

    fields = ("size", "limit")

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"Message of {size} bytes exceeds the server's max_payload of {limit} bytes; "
            "offload large data to the artifact store"
        )


class ArtifactNotFoundError(KernelError):
    """No artifact with this id exists in the object store."""

    fields = ("file_id",)

    def __init__(self, file_id: str) -> None:
        self.file_id = file_id
        super().__init__(f"Artifact {file_id!r} not found")


# --------------------------------------------------------------------------------------------------------
# Payload size


def headers_size(headers: Mapping[str, str] | None) -> int:
    """Bytes the header block adds to a message, computed the way nats-py encodes it."""
    if not headers:
        return 0
    size = _HEADER_FRAMING
    for key, value in headers.items():
        size += len(key.strip().encode()) + 2 + len(value.strip().encode()) + 2
    return size


def check_payload_size(nbytes: int, max_payload: int) -> None:
    """Raise `PayloadTooLargeError` when ``nbytes`` (payload plus headers) exceeds ``max_payload``."""
    if nbytes > max_payload:
        raise PayloadTooLargeError(nbytes, max_payload)


def _client_of(target: NATS | JetStreamContext | KeyValue | ObjectStore) -> NATS:
    # nats-py exposes no public accessor from a JetStream/KV/object-store handle to its connection.
    if isinstance(target, NATS):
        return target
    if isinstance(target, JetStreamContext):
        return target._nc
    return target._js._nc


def max_payload_of(target: NATS | JetStreamContext | KeyValue | ObjectStore) -> int:
    """The ``max_payload`` the connected server announced (it may change after a reconnect)."""
    return _client_of(target).max_payload


@overload
async def safe_publish(
    target: JetStreamContext,
    subject: str,
    data: bytes,
    *,
    headers: dict[str, str] | None = None,
    ack_timeout: float | None = None,
) -> PubAck: ...


@overload
async def safe_publish(
    target: NATS,
    subject: str,
    data: bytes,
    *,
    headers: dict[str, str] | None = None,
    ack_timeout: float | None = None,
) -> None: ...


async def safe_publish(
    target: NATS | JetStreamContext,
    subject: str,
    data: bytes,
    *,
    headers: dict[str, str] | None = None,
    ack_timeout: float | None = None,
) -> PubAck | None:
    """Publish after checking size: raises `PayloadTooLargeError` instead of letting the server drop us.

    With a JetStream context this is ``js.publish`` (returns the PubAck); with a plain connection it is a
    core ``nc.publish`` (``ack_timeout`` is then unused).
    """
    check_payload_size(len(data) + headers_size(headers), max_payload_of(target))
    if isinstance(target, JetStreamContext):
        return await target.publish(subject, data, timeout=ack_timeout, headers=headers)
    await target.publish(subject, data, headers=headers)
    return None


# --------------------------------------------------------------------------------------------------------
# Artifact store


def is_artifact_id(file_id: str | None) -> bool:
    """Whether ``file_id`` is a handle minted by `ArtifactStore` (``art_`` + 64 hex digits)."""
    return file_id is not None and _ARTIFACT_ID_RE.fullmatch(file_id) is not None


def artifact_id_for(data: bytes) -> str:
    """The content address of ``data``: ``art_<sha256 hex>``."""
    return ARTIFACT_ID_PREFIX + hashlib.sha256(data).hexdigest()


class ArtifactStore:
    """Content-addressed artifacts in a JetStream object store, and block offload/resolve over them.

    ``get_timeout`` bounds one download: nats-py streams the chunks through a consumer without a deadline.
    """

    def __init__(
        self, obj_store: ObjectStore, *, inline_limit: int = DEFAULT_INLINE_LIMIT, get_timeout: float = 30.0
    ) -> None:
        if inline_limit < 0:
            raise ValueError(f"inline_limit must be >= 0, got {inline_limit}")
        if get_timeout <= 0:
            raise ValueError(f"get_timeout must be > 0, got {get_timeout}")
        self._store = obj_store
        self.inline_limit = inline_limit
        self._get_timeout = get_timeout

    async def put(self, data: bytes) -> str:
        """Store ``data`` (idempotent: an artifact already present is not rewritten) and return its id."""
        file_id = artifact_id_for(data)
        try:
            info = await self._store.get_info(file_id)
        except ObjectNotFoundError:
            info = None
        if info is not None and info.size == len(data):
            return file_id
        # Two writers racing on the same new artifact both write; the later meta wins and both are the same
        # bytes, so readers see correct data (the loser's chunks stay until the bucket is compacted).
        chunk = min(_DEFAULT_CHUNK, max_payload_of(self._store))
        meta = ObjectMeta(name=file_id, options=ObjectMetaOptions(max_chunk_size=chunk))
        await self._store.put(file_id, data, meta=meta)
        return file_id

    async def get(self, file_id: str) -> bytes:
        """The bytes of artifact ``file_id``; `ArtifactNotFoundError` when there is none."""
        if not is_artifact_id(file_id):
            raise ArtifactNotFoundError(file_id)
        try:
            async with asyncio.timeout(self._get_timeout):
                result = await self._store.get(file_id)
        except ObjectNotFoundError:
            raise ArtifactNotFoundError(file_id) from None
        return result.data or b""

    async def exists(self, file_id: str) -> bool:
        """Whether artifact ``file_id`` is stored."""
        if not is_artifact_id(file_id):
            return False
        try:
            await self._store.get_info(file_id)
        except ObjectNotFoundError:
            return False
        return True

    async def offload(self, blocks: Sequence[BaseBlock]) -> list[BaseBlock]:
        """Copy of ``blocks`` where every media block (also nested in tool results) with ``data`` over the
        inline limit is stored and replaced by a handle (``data=None, file_id="art_<sha256>"``)."""
        if not _may_hold_media(blocks):  # the usual message: text, no coroutine per block
            return list(blocks)
        return [await self._offload_one(block) for block in blocks]

    async def resolve(self, blocks: Sequence[BaseBlock]) -> list[BaseBlock]:
        """The reverse of `offload`: load the bytes of every artifact handle back into its block."""
        if not _may_hold_media(blocks):
            return list(blocks)
        return [await self._resolve_one(block) for block in blocks]

    async def _offload_one(self, block: BaseBlock) -> BaseBlock:
        if isinstance(block, ToolResultBlock):
            content = await self.offload(block.content)
            if all(new is old for new, old in zip(content, block.content, strict=True)):
                return block
            return block.model_copy(update={"content": content})
        if not isinstance(block, MediaBlock) or block.data is None or len(block.data) <= self.inline_limit:
            return block
        file_id = await self.put(block.data)
        metadata = dict(block.metadata)
        if block.file_id is not None:
            metadata[_ORIGINAL_FILE_ID_KEY] = block.file_id
        # model_copy keeps mime_type (already sniffed when the block was built) and every other field.
        return block.model_copy(update={"data": None, "file_id": file_id, "metadata": metadata})

    async def _resolve_one(self, block: BaseBlock) -> BaseBlock:
        if isinstance(block, ToolResultBlock):
            content = await self.resolve(block.content)
            if all(new is old for new, old in zip(content, block.content, strict=True)):
                return block
            return block.model_copy(update={"content": content})
        if not isinstance(block, MediaBlock) or block.data is not None or not is_artifact_id(block.file_id):
            return block
        assert block.file_id is not None  # is_artifact_id checked it
        data = await self.get(block.file_id)
        metadata = dict(block.metadata)
        original = metadata.pop(_ORIGINAL_FILE_ID_KEY, None)
        file_id = original if isinstance(original, str) else None
        return block.model_copy(update={"data": data, "file_id": file_id, "metadata": metadata})


def _may_hold_media(blocks: Sequence[BaseBlock]) -> bool:
    """Whether any of `blocks` is a media block or may nest one (a tool result): only those are offloaded."""
    for block in blocks:  # noqa: SIM110 - a loop, not any(<generator>): runs on every message
        if isinstance(block, _MAY_HOLD_MEDIA):
            return True
    return False


_MAY_HOLD_MEDIA = (MediaBlock, ToolResultBlock)
