"""Which consumer reads each inbox partition: its name, kept where only the type's workers can read it.

A partition consumer's name ends in a random 128-bit nonce drawn at each take (`consumer_name`): nats-server
permissions match whole subject tokens and a consumer name is one token, so a worker may pull from, ack on
and delete any inbox consumer it can name; one that cannot learn a name cannot touch the consumer. The name
is recorded in the KV bucket ``plexus_consumers`` under ``<ns>.<type>.<p>`` (`consumer_record_key`), which a
worker may read (direct get by key) and write only for its own types; no worker may list the inbox's
consumers. The next owner reads the record, deletes exactly that consumer, records its own name with a
compare-and-swap on the revision it read (two takes racing cannot both record), and only then creates the
consumer, so every consumer on the inbox made by a worker is named by a record or already deleted.

`delete_unrecorded` is the operator's (`plexus topology`): it removes partition consumers no record names —
those made before records existed (an upgrade), or an owner's whose record was overwritten while it stalled.
"""

from __future__ import annotations

import json
import logging

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyDeletedError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from plexus.runtime.wire._subjects import consumer_record_key

__all__ = ["ConsumerRecords", "delete_unrecorded"]

_log = logging.getLogger(__name__)


class ConsumerRecords:
    """The records of one namespace's partition consumers in ``plexus_consumers``."""

    def __init__(self, kv: KeyValue, namespace: str) -> None:
        self.kv = kv
        self.namespace = namespace

    def key(self, agent_type: str, partition: int) -> str:
        return consumer_record_key(self.namespace, agent_type, partition)

    async def read(self, agent_type: str, partition: int) -> tuple[str | None, int]:
        """``(name, revision)`` of the partition's recorded consumer; ``(None, 0)`` when there is none."""
        try:
            entry = await self.kv.get(self.key(agent_type, partition))
        except KeyDeletedError as exc:  # an operator deleted it: the next record replaces the tombstone
            return None, (exc.entry.revision or 0) if exc.entry is not None else 0
        except KeyNotFoundError:
            return None, 0
        return (entry.value or b"").decode() or None, entry.revision or 0

    async def record(self, agent_type: str, partition: int, name: str, revision: int) -> int:
        """Record `name` if the record is still at `revision` (0: absent); raises
        `KeyWrongLastSequenceError` when another take recorded meanwhile."""
        return await self.kv.update(self.key(agent_type, partition), name.encode(), last=revision)


async def _consumer_filters(nc: NATS, stream: str, *, timeout: float = 10.0) -> dict[str, list[str]]:
    """Every consumer of `stream` with its filter subjects, page by page (`CONSUMER.LIST`: the operator's)."""
    found: dict[str, list[str]] = {}
    total = None
    while total is None or len(found) < total:
        reply = await nc.request(
            f"$JS.API.CONSUMER.LIST.{stream}", json.dumps({"offset": len(found)}).encode(), timeout=timeout
        )
        body = json.loads(reply.data)
        if "error" in body:
            APIError.from_error(body["error"])  # raises the typed error
        page = body.get("consumers") or []
        if not page:
            break
        for info in page:
            config = info.get("config") or {}
            filters = config.get("filter_subjects") or [config.get("filter_subject") or ""]
            found[info["name"]] = filters
        total = int(body.get("total", 0))
    return found


async def delete_unrecorded(
    nc: NATS, js: JetStreamContext, kv: KeyValue, stream: str, prefix: str
) -> list[str]:
    """Delete the partition consumers of `stream` (filter ``<prefix>.<ns>.inp.<type>.<p>.>``) whose name
    their partition's record does not hold; returns their names. Listed before the records are read: a
    consumer made after its record was written is then either still named by it or already deleted."""
    deleted: list[str] = []
    for name, filters in (await _consumer_filters(nc, stream)).items():
        if len(filters) != 1:
            continue
        tokens = filters[0].split(".")
        if len(tokens) != 6 or tokens[0] != prefix or tokens[2] != "inp" or tokens[5] != ">":
            continue
        _, ns, _, agent_type, partition, _ = tokens
        try:
            recorded = (await kv.get(f"{ns}.{agent_type}.{partition}")).value
        except (KeyNotFoundError, KeyDeletedError):
            recorded = None
        if recorded is not None and recorded.decode() == name:
            continue
        try:
            await js.delete_consumer(stream, name)
        except NotFoundError:
            continue
        _log.info("deleted %s on %s: no record names it (plexus_consumers)", name, stream)
        deleted.append(name)
    return deleted
