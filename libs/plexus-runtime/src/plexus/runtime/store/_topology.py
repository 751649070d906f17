"""Create the JetStream streams, KV buckets and object store Plexus runs on (docs/architecture.md).

`ensure_topology` is idempotent and safe to call from many processes at once: creating a stream that already
exists with the same configuration succeeds on the server, and "name already in use with a different
configuration" is answered by updating only the settings that are safe to change (ages, TTLs, history,
duplicate window, replicas). Settings whose change would break a running system — retention, storage, the
subjects (another prefix's deployment may own the stream) and the partition transform (keys would move to
other partitions while their messages are in flight) — raise `TopologyConflictError` instead; pass
``allow_repartition=True`` to change the partition count on purpose.

Partitioning is done by the server: ``PLEXUS_INBOX`` rewrites ``<prefix>.<ns>.in.<type>.<key>`` to
``<prefix>.<ns>.inp.<type>.<partition>.<key>`` with ``{{partition(P,3)}}``, which is FNV-1a (32 bit) of the
key token modulo P; `_subjects.inbox_partition` computes the same number client-side.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.api import (
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
    StreamSource,
    SubjectTransform,
)
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from plexus.core import KernelError
from plexus.runtime.wire._subjects import inbox_transform as _subject_transform

from ._outage import is_unavailable
from ._schedules import (
    STREAM_SCHEDULES,
    check_server_version,
    ensure_source_mark,
    inbox_source,
    schedules_stream,
)

_log = logging.getLogger(__name__)

__all__ = [
    "DLQ_MAX_AGE_S",
    "Topology",
    "TopologyConflictError",
    "TopologyNames",
    "ensure_topology",
    "inbox_transform",
]

DLQ_MAX_AGE_S = 7 * 24 * 3600.0
_STREAM_NAME_IN_USE = 10058
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")


class TopologyConflictError(KernelError):
    """An existing stream or bucket has a setting `ensure_topology` must not change on its own."""

    fields = ("name", "setting", "current", "desired")

    def __init__(self, name: str, setting: str, current: str, desired: str) -> None:
        self.name = name
        self.setting = setting
        self.current = current
        self.desired = desired
        super().__init__(f"{name} exists with {setting}={current}, refusing to change it to {desired}")


@dataclass(frozen=True, slots=True)
class TopologyNames:
    """Names of the streams and buckets; the defaults are those of docs/architecture.md."""

    inbox_stream: str = "PLEXUS_INBOX"
    events_stream: str = "PLEXUS_EVENTS"
    progress_stream: str = "PLEXUS_PROGRESS"
    dlq_stream: str = "PLEXUS_DLQ"
    counters_stream: str = "PLEXUS_COUNTERS"
    schedules_stream: str = STREAM_SCHEDULES
    checkpoints_bucket: str = "plexus_checkpoints"
    registry_bucket: str = "plexus_registry"
    subscriptions_bucket: str = "plexus_subscriptions"
    workers_bucket: str = "plexus_workers"
    leases_bucket: str = "plexus_leases"
    #: Each inbox partition's current consumer name (`_consumer_records`), read by direct get per key.
    consumers_bucket: str = "plexus_consumers"
    artifacts_bucket: str = "plexus_artifacts"
    runs_bucket: str = "plexus_runs"
    #: The gateway's buckets: created with the rest by the operator, so that no other role needs to create
    #: a stream (a user that may create one can give it any subjects, other identities' replies included).
    sessions_bucket: str = "plexus_sessions"
    tokens_bucket: str = "plexus_gateway_tokens"


@dataclass(frozen=True, slots=True)
class Topology:
    """Handles to what `ensure_topology` created, with the settings it used."""

    prefix: str
    partitions: int
    names: TopologyNames
    checkpoints: KeyValue
    registry: KeyValue
    subscriptions: KeyValue
    workers: KeyValue
    leases: KeyValue
    consumers: KeyValue
    runs: KeyValue
    sessions: KeyValue
    tokens: KeyValue
    artifacts: ObjectStore
    streams: dict[str, StreamInfo] = field(default_factory=dict)
    #: The TTLs the buckets really have (what this process asked for only if it created or reconciled
    #: them): leases and worker heartbeats must be timed by these.
    workers_ttl_s: float = 10.0
    leases_ttl_s: float = 10.0


def inbox_transform(prefix: str, partitions: int) -> SubjectTransform:
    """The inbox transform as nats-py config (the strings are defined once, in `_subjects`)."""
    src, dest = _subject_transform(partitions, prefix)
    return SubjectTransform(src=src, dest=dest)


#: How long `ensure_topology` waits for JetStream to answer: a cluster that just started (or lost its
#: meta leader) answers API requests only after its Raft election, which takes seconds under load.
READY_TIMEOUT_S = 30.0


async def ensure_topology(
    js: JetStreamContext,
    *,
    prefix: str = "px",
    partitions: int = 16,
    progress_max_age_s: float = 3600.0,
    replicas: int | None = None,
    dedupe_window_s: float = 120.0,
    workers_ttl_s: float = 10.0,
    leases_ttl_s: float = 10.0,
    dlq_max_age_s: float = DLQ_MAX_AGE_S,
    storage: StorageType = StorageType.FILE,
    names: TopologyNames | None = None,
    allow_repartition: bool = False,
) -> Topology:
    """Create or reconcile every stream and bucket of docs/architecture.md and return handles to them.

    Raises ValueError for bad arguments and `TopologyConflictError` when an existing object has an
    incompatible setting (see the module docstring). `replicas` None creates R1 objects and leaves existing
    ones as they are: a worker or client connecting with its defaults must never scale an operator's R3
    cluster down to R1 nor change its TTLs or windows (a worker's user may not, and two processes asking
    for different TTLs would flip them back and forth under each other's leases); only a process that
    names `replicas` (the operator, `plexus topology`) reconciles an existing topology. The others adopt
    it: the returned `Topology` carries the TTLs the buckets really have.
    """
    names = names or TopologyNames()
    if not _TOKEN_RE.fullmatch(prefix):
        raise ValueError(f"prefix must be one subject token of [A-Za-z0-9_-], got {prefix!r}")
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if replicas is not None and replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    for label, value in (
        ("progress_max_age_s", progress_max_age_s),
        ("dedupe_window_s", dedupe_window_s),
        ("workers_ttl_s", workers_ttl_s),
        ("leases_ttl_s", leases_ttl_s),
        ("dlq_max_age_s", dlq_max_age_s),
    ):
        if value <= 0:
            raise ValueError(f"{label} must be > 0, got {value}")

    # Timers and reminders are JetStream message schedules: refuse, naming it, a server without them.
    server = js._nc.connected_server_version
    check_server_version(f"{server.major}.{server.minor}.{server.patch}")
    common: dict[str, Any] = {"storage": storage, "num_replicas": replicas}
    streams = [
        # First: the inbox sources its fired copies, and the server asks a source's stream leader for the
        # sourcing consumer. A source stream that does not exist yet (on a cluster: that has no leader yet)
        # leaves the request unanswered: the inbox waits 30 s, then retries with a growing backoff (10 s,
        # 20 s, ... up to 2 min), and every fire meanwhile waits in PLEXUS_SCHEDULES (docs/schedules.md).
        schedules_stream(prefix, storage, replicas, names.schedules_stream, dedupe_window_s),
        StreamConfig(
            name=names.inbox_stream,
            description="Plexus durable agent inboxes (work queue, partitioned by key)",
            subjects=[f"{prefix}.*.in.*.*"],
            retention=RetentionPolicy.WORK_QUEUE,
            duplicate_window=dedupe_window_s,
            subject_transform=inbox_transform(prefix, partitions),
            # Fired timers and reminders (docs/schedules.md), moved onto their target's inbox subject.
            sources=[inbox_source(prefix, partitions, names.schedules_stream)],
            **common,
        ),
        StreamConfig(
            name=names.events_stream,
            description="Plexus agent EventLogs",
            subjects=[f"{prefix}.*.evlog.>"],
            retention=RetentionPolicy.LIMITS,
            duplicate_window=dedupe_window_s,
            **common,
        ),
        StreamConfig(
            name=names.progress_stream,
            description="Plexus agent progress, replayable per run tree",
            subjects=[f"{prefix}.*.progress.>"],
            retention=RetentionPolicy.LIMITS,
            max_age=progress_max_age_s,
            duplicate_window=min(dedupe_window_s, progress_max_age_s),
            **common,
        ),
        StreamConfig(
            name=names.dlq_stream,
            description="Plexus dead letters (reason in headers)",
            subjects=[f"{prefix}.*.dlq.>"],
            retention=RetentionPolicy.LIMITS,
            max_age=dlq_max_age_s,
            duplicate_window=min(dedupe_window_s, dlq_max_age_s),
            **common,
        ),
        StreamConfig(
            name=names.counters_stream,
            description="Plexus run-tree budget totals and handler-attempt counters (Nats-Incr)",
            subjects=[f"{prefix}.*.ctr.>"],
            retention=RetentionPolicy.LIMITS,
            max_age=dlq_max_age_s,
            # Explicit: nats-py's default 0 differs from the server's 120 s, so every connection "reconciled"
            # (updated) this stream, which a user without stream-admin rights may not do.
            duplicate_window=min(dedupe_window_s, dlq_max_age_s),
            allow_msg_counter=True,
            **common,
        ),
    ]
    infos: dict[str, StreamInfo] = {}
    for config in streams:
        assert config.name is not None
        infos[config.name] = await _until_answered(
            partial(
                _ensure_stream,
                js,
                config,
                allow_repartition=allow_repartition,
                reconcile=replicas is not None or allow_repartition,
            )
        )
    if replicas is not None or allow_repartition:
        # The operator's run: only it may write a fire subject (a worker's or client's run adopts).
        marked = await _until_answered(partial(ensure_source_mark, js, prefix, names.inbox_stream))
        if not marked:
            _log.warning(
                "%s has not sourced its source mark from %s yet: fires made before it arrives may be "
                "skipped if a leader moves meanwhile (docs/schedules.md)",
                names.inbox_stream,
                names.schedules_stream,
            )

    keep = replicas is None

    async def bucket(name: str, ttl: float | None = None, *, direct: bool | None = None) -> KeyValue:
        config = KeyValueConfig(
            bucket=name, history=1, ttl=ttl, replicas=replicas or 1, storage=storage, direct=direct
        )
        return await _until_answered(lambda: _ensure_kv(js, config, keep_replicas=keep))

    workers = await bucket(names.workers_bucket, workers_ttl_s)
    leases = await bucket(names.leases_bucket, leases_ttl_s)
    return Topology(
        prefix=prefix,
        partitions=partitions,
        names=names,
        checkpoints=await bucket(names.checkpoints_bucket),
        registry=await bucket(names.registry_bucket),
        subscriptions=await bucket(names.subscriptions_bucket),
        workers=workers,
        leases=leases,
        # Direct gets put the key in the request's subject, so permissions can grant reads per type.
        consumers=await bucket(names.consumers_bucket, direct=True),
        runs=await bucket(names.runs_bucket),
        sessions=await bucket(names.sessions_bucket),
        tokens=await bucket(names.tokens_bucket),
        artifacts=await _until_answered(
            lambda: _ensure_object_store(js, names.artifacts_bucket, replicas=replicas, storage=storage)
        ),
        streams=infos,
        workers_ttl_s=(await _until_answered(workers.status)).ttl or workers_ttl_s,
        leases_ttl_s=(await _until_answered(leases.status)).ttl or leases_ttl_s,
    )


# --------------------------------------------------------------------------------------------------------
# Reconciliation

#: How long a request of `ensure_topology` may go unanswered: a cluster that just started (or lost its
#: meta leader) answers the JetStream API only after its Raft election, which takes seconds under load.
READY_TIMEOUT_S = 30.0

T = TypeVar("T")


async def _until_answered(step: Callable[[], Awaitable[T]]) -> T:
    """Run an idempotent reconcile step again while JetStream does not answer (see `READY_TIMEOUT_S`)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            return await step()
        except Exception as exc:
            # A cluster that just started may not know all its peers yet: placement of an R3 object fails
            # with "no suitable peers" (10005) for a moment, like an unanswered request.
            placement = isinstance(exc, BadRequestError) and exc.err_code == _NO_SUITABLE_PEERS
            if not (is_unavailable(exc) or placement) or time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)


_NO_SUITABLE_PEERS = 10005
_STREAM_MANAGED = ("max_age", "duplicate_window", "num_replicas", "sources")
_STREAM_FROZEN = ("retention", "storage", "subjects", "subject_transform")


async def _ensure_stream(
    js: JetStreamContext,
    desired: StreamConfig,
    *,
    managed: tuple[str, ...] = _STREAM_MANAGED,
    frozen: tuple[str, ...] = _STREAM_FROZEN,
    allow_repartition: bool = False,
    reconcile: bool = True,
) -> StreamInfo:
    """Create ``desired``; if a different stream of that name exists, reconcile the ``managed`` settings
    and refuse to touch the ``frozen`` ones. Settings ``desired`` leaves None are not compared.

    It looks before it writes: a stream that exists as desired costs one STREAM.INFO, so a process whose
    NATS user may only read the JetStream API (a client, a worker under `plexus security`) connects to a
    topology an operator created without ever asking to create or change it."""
    assert desired.name is not None
    if not await _exists(js, desired.name):
        try:
            return await js.add_stream(desired)
        except BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:  # created meanwhile by another process: reconcile
                raise
    if allow_repartition:
        frozen = tuple(s for s in frozen if s != "subject_transform")
        managed = (*managed, "subject_transform")
    current = (await js.stream_info(desired.name)).config
    for setting in frozen:
        have, want = _norm(getattr(current, setting)), _norm(getattr(desired, setting))
        if want is not None and have != want:
            raise TopologyConflictError(desired.name, setting, str(have), str(want))
    patch = {
        setting: getattr(desired, setting)
        for setting in managed
        if getattr(desired, setting) is not None
        and _norm(getattr(current, setting)) != _norm(getattr(desired, setting))
    }
    if not patch:
        # Differences only in settings we do not manage (e.g. an operator enabled allow_direct): keep them.
        return await js.stream_info(desired.name)
    if not reconcile:
        _log.warning(
            "%s differs from what this process asked for (%s); keeping the cluster's settings "
            "(the operator changes them: `plexus topology`)",
            desired.name,
            ", ".join(f"{k}={v}" for k, v in patch.items()),
        )
        return await js.stream_info(desired.name)
    return await js.update_stream(current.evolve(**patch))


def _norm(value: Any) -> Any:
    # The server echoes defaults (max_age 0.0, lists, plain strings for enums); compare on that form.
    if value is None:
        return None
    if isinstance(value, RetentionPolicy | StorageType):
        return value.value
    if isinstance(value, list) and value and isinstance(value[0], StreamSource):
        # The server echoes sources with its own defaults filled in: compare what we set.
        return tuple(
            (s.name, s.filter_subject, tuple((t.src, t.dest) for t in s.subject_transforms or ()))
            for s in value
        )
    if isinstance(value, float | int) and not isinstance(value, bool):
        return float(value)
    return value


async def _exists(js: JetStreamContext, stream: str) -> bool:
    try:
        await js.stream_info(stream)
    except NotFoundError:
        return False
    return True


async def _ensure_kv(
    js: JetStreamContext, config: KeyValueConfig, *, keep_replicas: bool = False
) -> KeyValue:
    """Like `_ensure_stream` for a KV bucket; `keep_replicas` (a process that did not name `replicas`)
    also means: adopt an existing bucket as it is."""
    if not await _exists(js, f"KV_{config.bucket}"):
        try:
            return await js.create_key_value(config)
        except BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
    ttl = config.ttl or 0.0
    # Mirrors nats-py's create_key_value: the duplicate window may not exceed the bucket TTL.
    window = min(120.0, ttl) if ttl else 120.0
    desired = StreamConfig(
        name=f"KV_{config.bucket}",
        max_age=ttl,
        max_msgs_per_subject=config.history,
        duplicate_window=window,
        num_replicas=None if keep_replicas else config.replicas,
        storage=config.storage,
    )
    await _ensure_stream(
        js, desired, managed=(*_STREAM_MANAGED, "max_msgs_per_subject"), reconcile=not keep_replicas
    )
    return await js.key_value(config.bucket)


async def _ensure_object_store(
    js: JetStreamContext, bucket: str, *, replicas: int | None, storage: StorageType
) -> ObjectStore:
    if not await _exists(js, f"OBJ_{bucket}"):
        try:
            return await js.create_object_store(
                bucket, config=ObjectStoreConfig(replicas=replicas or 1, storage=storage)
            )
        except BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
    if replicas is not None:  # None: leave an existing store's replicas as the operator set them
        desired = StreamConfig(name=f"OBJ_{bucket}", num_replicas=replicas, storage=storage)
        await _ensure_stream(js, desired, managed=("num_replicas",))
    return await js.object_store(bucket)
