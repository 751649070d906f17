"""Sessions (seed 003's multi-session kernel): one conversation with one agent, its transcript and memory.

Everything lives in the ``plexus_sessions`` KV bucket (created with the topology), so any gateway replica, or
this one after a restart, serves every session:

- ``meta.<session>``: the session record (agent type, the AgentId serving it, parent session, created_at);
- ``tx.<session>``: the transcript, a JSON array of seed 002 `Item`s, written with compare-and-set so two
  replicas appending at once never lose an item;
- ``mem.<session>.<key>``: one memory value (any JSON) per key.

A session's agent is ``AgentId(<type>, <session id>)``: each session gets its own agent instance.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from plexus.core import CUSTOM_TYPE_KEY, AgentId, BaseBlock, Item, ItemKind, SessionId, TextBlock
from plexus.runtime.kernel import escape_token

from ._kv import keys_matching

__all__ = [
    "BUCKET",
    "RUN_ID_KEY",
    "SessionNotFound",
    "SessionStore",
    "check_memory_key",
    "ending_item",
    "user_item",
]

BUCKET = "plexus_sessions"
#: Metadata key linking a transcript item to the run it started or ended.
RUN_ID_KEY = "plexus.run_id"
_MEMORY_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
_CAS_ATTEMPTS = 20


class SessionNotFound(LookupError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"unknown session {session_id!r}")
        self.session_id = session_id


def check_memory_key(key: str) -> str:
    if not _MEMORY_KEY.match(key):
        raise ValueError("a memory key is 1-128 characters of A-Z, a-z, 0-9, '_' and '-'")
    return key


class SessionStore:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> SessionStore:
        """The store over ``plexus_sessions``, which the topology creates (`Runtime.connect`, `plexus
        topology`): the gateway's user may not create streams (docs/security.md)."""
        try:
            kv = await js.key_value(BUCKET)
        except (BucketNotFoundError, NotFoundError):
            raise ValueError(
                f"the {BUCKET} bucket does not exist: create the topology (`plexus topology`)"
            ) from None
        return cls(kv)

    # -- sessions ---------------------------------------------------------------------------------------
    async def create(self, agent_type: str, parent_id: str | None, title: str | None) -> dict[str, Any]:
        if parent_id is not None:
            await self.get(parent_id)  # a child session needs a parent that exists
        session_id = str(SessionId.new())
        agent_id = AgentId(agent_type, session_id)
        meta = {
            "session_id": session_id,
            "agent_type": agent_type,
            "agent_id": str(agent_id),
            "parent_id": parent_id,
            "title": title,
            "created_at": time.time(),
        }
        await self.kv.create(f"meta.{escape_token(session_id)}", json.dumps(meta).encode())
        return meta

    async def get(self, session_id: str) -> dict[str, Any]:
        value = await self._value(f"meta.{escape_token(session_id)}")
        if value is None:
            raise SessionNotFound(session_id)
        loaded: dict[str, Any] = json.loads(value)
        return loaded

    async def all(self) -> list[dict[str, Any]]:
        keys = await keys_matching(self.kv, "meta.>")
        out = []
        for key in keys:
            value = await self._value(key)
            if value is not None:
                out.append(json.loads(value))
        out.sort(key=lambda m: float(m.get("created_at", 0.0)), reverse=True)
        return out

    # -- transcript -------------------------------------------------------------------------------------
    async def transcript(self, session_id: str) -> list[Item]:
        value = await self._value(f"tx.{escape_token(session_id)}")
        if value is None:
            return []
        return [Item.model_validate(raw) for raw in json.loads(value)]

    async def append(self, session_id: str, *new: Item, unless_run_ended: str | None = None) -> bool:
        """Append the ``new`` items in one write (compare-and-set). With ``unless_run_ended``, skip them when
        the transcript already holds the end of that run (so the replica that streamed it and one
        reconciling never both write)."""
        key = f"tx.{escape_token(session_id)}"
        for _ in range(_CAS_ATTEMPTS):
            revision = 0
            items: list[Any] = []
            try:
                entry = await self.kv.get(key)
                revision = entry.revision or 0
                items = json.loads(entry.value or b"[]")
            except (KeyNotFoundError, NotFoundError):
                pass
            if unless_run_ended is not None and any(
                i.get("kind") != "user" and i.get("metadata", {}).get(RUN_ID_KEY) == unless_run_ended
                for i in items
            ):
                return False
            items.extend(item.model_dump(mode="json") for item in new)
            data = json.dumps(items).encode()
            try:
                if revision:
                    await self.kv.update(key, data, last=revision)
                else:
                    await self.kv.create(key, data)
                return True
            except Exception as exc:
                if not _is_conflict(exc):
                    raise
        raise RuntimeError(f"could not append to the transcript of {session_id}: too many concurrent writers")

    # -- memory -----------------------------------------------------------------------------------------
    async def memory_get(self, session_id: str, key: str) -> Any:
        value = await self._value(f"mem.{escape_token(session_id)}.{check_memory_key(key)}")
        if value is None:
            raise KeyError(key)
        return json.loads(value)

    async def memory_put(self, session_id: str, key: str, value: Any) -> None:
        await self.kv.put(
            f"mem.{escape_token(session_id)}.{check_memory_key(key)}", json.dumps(value).encode()
        )

    async def memory_delete(self, session_id: str, key: str) -> bool:
        full = f"mem.{escape_token(session_id)}.{check_memory_key(key)}"
        if await self._value(full) is None:
            return False
        await self.kv.delete(full)
        return True

    async def memory_keys(self, session_id: str) -> list[str]:
        prefix = f"mem.{escape_token(session_id)}."
        keys = await keys_matching(self.kv, prefix + ">")
        return sorted(k[len(prefix) :] for k in keys)

    async def _value(self, key: str) -> bytes | None:
        try:
            entry = await self.kv.get(key)
        except (KeyNotFoundError, NotFoundError):
            return None
        return entry.value or None


def _is_conflict(exc: Exception) -> bool:
    if isinstance(exc, KeyWrongLastSequenceError):
        return True
    # create() on a key another writer created first reports "wrong last sequence" as a plain APIError.
    return "wrong last sequence" in str(exc).lower() or getattr(exc, "err_code", None) == 10071


def user_item(blocks: list[BaseBlock], run_id: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=blocks, metadata={RUN_ID_KEY: run_id})


def ending_item(record: dict[str, Any], blocks: list[BaseBlock]) -> Item:
    """The transcript entry for a run that ended: the reply, or a custom item saying why there is none."""
    run_id = str(record["run_id"])
    if record.get("status") == "completed":
        return Item(kind=ItemKind.ASSISTANT, blocks=blocks, metadata={RUN_ID_KEY: run_id})
    reason = str(record.get("reason") or record.get("status"))
    return Item(
        kind=ItemKind.CUSTOM,
        blocks=[TextBlock(text=f"run {record.get('status')}: {reason}")],
        metadata={
            RUN_ID_KEY: run_id,
            CUSTOM_TYPE_KEY: "plexus.run_ended",
            "status": str(record.get("status")),
        },
    )
