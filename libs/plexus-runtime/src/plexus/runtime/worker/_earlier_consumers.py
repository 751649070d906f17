"""Finding the consumers earlier owners made for an inbox partition, which a new owner deletes by name.

Every ownership's consumer is named ``consumer_name(ns, type, p, prefix, epoch=<lease revision>)``, so a
partition's consumers are told apart by name alone: ``$JS.API.CONSUMER.NAMES.<stream>`` (names only, 1024 a
page; a cluster's meta leader answers it from its own assignments, so it is never partial) is one request
for a whole stream. ``CONSUMER.LIST`` (full infos, 256 a page) made every take cost megabytes, and in a
cluster it gathers each info from the consumer's leader and leaves out the ones that are slow to answer: a
missed old consumer made the work-queue stream refuse the new one, and the take failed. Only names shortened
to a hash (over 255 characters) can be ambiguous; their filter is then read with ``CONSUMER.INFO``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from plexus.runtime.wire._subjects import MAX_CONSUMER_NAME, Subjects, consumer_name

__all__ = ["consumer_names", "partition_consumers"]

#: The tail of a name shortened to its SHA-256 (`consumer_name`).
_HASHED = re.compile(r"__h[0-9a-f]{64}\Z")


async def consumer_names(nc: NATS, stream: str, *, timeout: float = 5.0) -> list[str]:
    """Every consumer name of `stream`, page by page (nats-py has no call for ``CONSUMER.NAMES``)."""
    names: list[str] = []
    while True:
        reply = await nc.request(
            f"$JS.API.CONSUMER.NAMES.{stream}", json.dumps({"offset": len(names)}).encode(), timeout=timeout
        )
        body = json.loads(reply.data)
        if "error" in body:
            APIError.from_error(body["error"])  # raises the typed error
        page = body.get("consumers") or []
        names += page
        if not page or len(names) >= int(body.get("total", 0)):
            return names


def _matches(
    names: Iterable[str], prefix: str, namespace: str, agent_type: str, partition: int
) -> tuple[list[str], list[str]]:
    """``(certain, hashed)``: the names of this partition's consumers, and shortened names that may be."""
    base = consumer_name(namespace, agent_type, partition, prefix)
    head = f"{base}__"
    # A shortened name keeps the first `keep` characters of the full one, which may stop short of the
    # partition (then other partitions' names share them). Only a full name longer than `head` is shortened.
    keep = MAX_CONSUMER_NAME - 64 - 3
    may_be_hashed = len(head) >= keep
    certain: list[str] = []
    hashed: list[str] = []
    for name in names:
        if name == base or (name.startswith(head) and name[len(head) :].isdigit()):
            certain.append(name)  # tokens never contain `__`, so no other partition's name looks like this
        elif may_be_hashed and name[:keep] == head[:keep] and _HASHED.search(name):
            hashed.append(name)
    return certain, hashed


async def partition_consumers(
    nc: NATS,
    js: JetStreamContext,
    stream: str,
    subjects: Subjects,
    agent_type: str,
    partition: int,
    *,
    names: Iterable[str] | None = None,
) -> list[str]:
    """The consumers on `stream` that owners of `agent_type`'s `partition` made (with the partition's filter).

    `names` is a listing of the stream's consumer names to pick from (one per rebalance round serves every
    take of the round); None lists them now.
    """
    listed = await consumer_names(nc, stream) if names is None else names
    certain, hashed = _matches(listed, subjects.prefix, subjects.namespace, agent_type, partition)
    filter_subject = subjects.inbox_partitioned_filter(agent_type, partition)
    for name in hashed:
        try:
            config = (await js.consumer_info(stream, name)).config
        except NotFoundError:
            continue
        if config.filter_subject == filter_subject or filter_subject in (config.filter_subjects or ()):
            certain.append(name)
    return certain
