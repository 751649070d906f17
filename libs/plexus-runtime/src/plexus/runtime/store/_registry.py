"""Cluster registry: agent types (``plexus_registry``) and worker heartbeats (``plexus_workers``).

Both buckets hold msgspec-JSON Structs. Type keys are ``<ns>.<type>`` and worker keys ``<worker_id>``, each
token escaped so any name is a valid KV key. The workers bucket has a bucket-level TTL equal to the heartbeat
TTL, so a dead worker's key disappears by itself; readers also treat a heartbeat older than the TTL as dead,
because the server removes expired messages on its own schedule.

`KVMirror` (a dict kept current by a KV watch) is shared with the subscription table; `RegistryCache` uses it
to answer hot-path lookups from memory.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from plexus.core import AgentId
from plexus.runtime.ops._version import installed_version
from plexus.runtime.wire._subjects import escape_token

from ._mirror import ChangeSignal, KVMirror, kv_snapshot

__all__ = [
    "AgentTypeInfo",
    "AgentTypeNotFoundError",
    "ChangeSignal",
    "KVMirror",
    "Registry",
    "RegistryCache",
    "WorkerInfo",
    "kv_snapshot",
    "topic_group",
    "topic_groups",
    "type_ref",
]

_log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a one-shot scan of a bucket may take before the server is considered unreachable.
_SCAN_TIMEOUT_S = 5.0
# CAS retries for register_type; more than a handful means a writer is looping, not a race.
_CAS_ATTEMPTS = 8


def type_ref(namespace: str, agent_type: str) -> str:
    """The ``"ns/type"`` form used in `WorkerInfo.types`."""
    return f"{namespace}/{agent_type}"


def topic_group(stateless_types: Iterable[str]) -> str:
    """The topic delivery group of a worker hosting `stateless_types` (one namespace's): workers hosting the
    same set share it, so a publication reaches one worker per distinct set, once (see `Worker`)."""
    digest = hashlib.sha256("\n".join(sorted(set(stateless_types))).encode()).hexdigest()
    return "g" + digest[:16]


def topic_groups(stateless_types: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Namespace → topic delivery group of a worker hosting these stateless ``(namespace, type)`` pairs."""
    by_ns: dict[str, list[str]] = {}
    for namespace, agent_type in stateless_types:
        by_ns.setdefault(namespace, []).append(agent_type)
    return {ns: topic_group(names) for ns, names in by_ns.items()}


def _check_names(namespace: str, agent_type: str) -> None:
    # AgentId owns the naming rules; building one raises a ValueError that names the bad part.
    AgentId(agent_type, "_", namespace)


class AgentTypeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the cluster knows about an agent type without instantiating it.

    `durable` and `partitions` shape the inbox routing, so a registration may not change them; the other
    fields may be updated by re-registering. `version` is the type's own version, bumped by its author.
    """

    namespace: str
    type: str
    durable: bool
    partitions: int
    description: str = ""
    capabilities: list[str] = msgspec.field(default_factory=list)
    version: int = 1
    metadata: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_names(self.namespace, self.type)
        if self.partitions < 1:
            raise ValueError(f"agent type {self.ref}: partitions must be >= 1, got {self.partitions}")
        if any(not c for c in self.capabilities):
            raise ValueError(f"agent type {self.ref}: capabilities must be non-empty strings")

    @property
    def ref(self) -> str:
        return type_ref(self.namespace, self.type)


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's heartbeat. Times are Unix seconds (wall clock: they are compared across hosts).

    `types` lists the hosted agent types as ``"ns/type"`` refs; `topic_groups` maps a namespace to the
    worker's topic delivery group there (`topic_group` of its stateless types); `version` is the worker's
    plexus-runtime version; `features` names what it can read that earlier versions cannot (a writer
    uses such a form only when every live host of the type lists it: `RegistryCache.supported_by_all`).
    """

    worker_id: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float = 0.0
    types: list[str] = msgspec.field(default_factory=list)
    concurrency: int = 1
    version: str = ""
    topic_groups: dict[str, str] = msgspec.field(default_factory=dict)
    features: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("worker_id must not be empty")
        if self.concurrency < 1:
            raise ValueError(f"worker {self.worker_id}: concurrency must be >= 1, got {self.concurrency}")
        for ref in self.types:
            namespace, sep, agent_type = ref.partition("/")
            if not sep:
                raise ValueError(f"worker {self.worker_id}: hosted type {ref!r} is not 'ns/type'")
            _check_names(namespace, agent_type)

    @classmethod
    def local(cls, worker_id: str, types: Iterable[str] = (), concurrency: int = 1) -> WorkerInfo:
        """A WorkerInfo for this process (host name, pid, start time, installed Plexus version)."""
        version = installed_version()
        now = time.time()
        return cls(
            worker_id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=now,
            heartbeat_at=now,
            types=sorted(set(types)),
            concurrency=concurrency,
            version=version,
        )

    def hosts(self, ref: str) -> bool:
        return ref in self.types

    def is_live(self, ttl_s: float, now: float | None = None) -> bool:
        # A heartbeat from the future (clock skew) counts as live rather than dead.
        return (time.time() if now is None else now) - self.heartbeat_at <= ttl_s


class AgentTypeNotFoundError(LookupError):
    """No agent type ``namespace/type`` is registered."""

    def __init__(self, namespace: str, agent_type: str) -> None:
        self.namespace = namespace
        self.type = agent_type
        super().__init__(f"agent type {type_ref(namespace, agent_type)} is not registered")


_type_decoder = msgspec.json.Decoder(AgentTypeInfo)
_worker_decoder = msgspec.json.Decoder(WorkerInfo)
_encoder = msgspec.json.Encoder()


@functools.lru_cache(maxsize=4096)  # read before every send: a process talks to few types
def _type_key(namespace: str, agent_type: str) -> str:
    return f"{escape_token(namespace)}.{escape_token(agent_type)}"


def _worker_key(worker_id: str) -> str:
    return escape_token(worker_id)


def _decode_all(raw: Mapping[str, bytes], decode: Callable[[bytes], T]) -> list[T]:
    out: list[T] = []
    for key, value in raw.items():
        try:
            out.append(decode(value))
        except ValueError as exc:  # a newer or broken writer (msgspec errors are ValueErrors): skip it
            _log.warning("skipping undecodable KV value at %s: %s", key, exc)
    return out


#: Agent types whose live host `RegistryCache.has_live_host` remembers (cleared when full).
_LIVE_UNTIL_KEPT = 4096


def _live(workers: Iterable[WorkerInfo], ttl_s: float, ref: str | None) -> list[WorkerInfo]:
    now = time.time()
    found = [w for w in workers if w.is_live(ttl_s, now) and (ref is None or w.hosts(ref))]
    return sorted(found, key=lambda w: w.worker_id)


def _by_capability(
    types: Iterable[AgentTypeInfo], capability: str, namespace: str | None
) -> list[AgentTypeInfo]:
    found = [t for t in types if capability in t.capabilities and namespace in (None, t.namespace)]
    return sorted(found, key=lambda t: (t.namespace, t.type))


def _check_compatible(old: AgentTypeInfo, new: AgentTypeInfo) -> None:
    if (old.durable, old.partitions) != (new.durable, new.partitions):
        raise ValueError(
            f"agent type {new.ref} is already registered with durable={old.durable}, "
            f"partitions={old.partitions}; re-registering it with durable={new.durable}, "
            f"partitions={new.partitions} would re-route its inbox (use a new type name, or unregister "
            "the old one once no worker hosts it)"
        )


class Registry:
    """Reads and writes the registry and workers buckets directly (no cache; see `RegistryCache`)."""

    def __init__(self, types_kv: KeyValue, workers_kv: KeyValue, *, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s (the heartbeat TTL) must be > 0, got {ttl_s}")
        self.types_kv = types_kv
        self.workers_kv = workers_kv
        self.ttl_s = ttl_s

    # -- agent types ------------------------------------------------------------------------------------
    async def register_type(self, info: AgentTypeInfo) -> AgentTypeInfo:
        """Register or update `info`. Idempotent; changing `durable`/`partitions` raises ValueError."""
        key = _type_key(info.namespace, info.type)
        data = _encoder.encode(info)
        for _ in range(_CAS_ATTEMPTS):
            try:
                entry = await self.types_kv.get(key)
            except KeyNotFoundError:
                try:
                    await self.types_kv.create(key, data)
                    return info
                except KeyWrongLastSequenceError:
                    continue  # another worker registered it first: compare against theirs
            old = _type_decoder.decode(entry.value or b"")
            _check_compatible(old, info)
            if old == info:
                return info
            try:
                await self.types_kv.update(key, data, last=entry.revision)
                return info
            except KeyWrongLastSequenceError:
                continue
        raise RuntimeError(f"agent type {info.ref}: registration lost {_CAS_ATTEMPTS} compare-and-swap races")

    async def unregister_type(self, namespace: str, agent_type: str) -> bool:
        """Delete a registration; False if there was none."""
        if await self.get_type(namespace, agent_type) is None:
            return False
        await self.types_kv.delete(_type_key(namespace, agent_type))
        return True

    async def get_type(self, namespace: str, agent_type: str) -> AgentTypeInfo | None:
        try:
            entry = await self.types_kv.get(_type_key(namespace, agent_type))
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        return _type_decoder.decode(entry.value)

    async def list_types(self, namespace: str | None = None) -> list[AgentTypeInfo]:
        keys = ">" if namespace is None else f"{escape_token(namespace)}.*"
        types = _decode_all(await kv_snapshot(self.types_kv, keys), _type_decoder.decode)
        return sorted(types, key=lambda t: (t.namespace, t.type))

    async def capabilities(self, namespace: str, agent_type: str) -> list[str]:
        info = await self.get_type(namespace, agent_type)
        if info is None:
            raise AgentTypeNotFoundError(namespace, agent_type)
        return list(info.capabilities)

    async def find_by_capability(self, capability: str, namespace: str | None = None) -> list[AgentTypeInfo]:
        return _by_capability(await self.list_types(namespace), capability, namespace)

    # -- workers ----------------------------------------------------------------------------------------
    async def heartbeat(self, worker: WorkerInfo) -> WorkerInfo:
        """Store `worker` with ``heartbeat_at`` = now; returns what was stored."""
        stamped = msgspec.structs.replace(worker, heartbeat_at=time.time())
        await self.workers_kv.put(_worker_key(worker.worker_id), _encoder.encode(stamped))
        return stamped

    async def live_workers(self, ns_type: str | None = None) -> list[WorkerInfo]:
        """Workers whose heartbeat is younger than the TTL, optionally only those hosting ``"ns/type"``."""
        workers = _decode_all(await kv_snapshot(self.workers_kv), _worker_decoder.decode)
        return _live(workers, self.ttl_s, ns_type)

    async def remove_worker(self, worker_id: str) -> None:
        """Graceful shutdown: forget the worker now instead of waiting for its heartbeat to expire."""
        await self.workers_kv.delete(_worker_key(worker_id))

    async def wait_for_host(self, namespace: str, agent_type: str, timeout: float) -> bool:
        """True as soon as a live worker hosts ``namespace/type``; False at the deadline. Watch-driven."""
        mirror: KVMirror[WorkerInfo] = KVMirror(self.workers_kv, _worker_decoder.decode)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await mirror.start()
        try:
            ref = type_ref(namespace, agent_type)
            return await mirror.wait_until(
                lambda: bool(_live(mirror.items.values(), self.ttl_s, ref)), deadline - loop.time()
            )
        finally:
            await mirror.stop()


class RegistryCache:
    """An in-memory view of both buckets, updated by KV watches, for lookups on the hot path."""

    def __init__(self, registry: Registry) -> None:
        self.ttl_s = registry.ttl_s
        # One signal for both mirrors, so a waiter wakes on a change of either bucket.
        self._signal = signal = ChangeSignal()
        self._types: KVMirror[AgentTypeInfo] = KVMirror(
            registry.types_kv, _type_decoder.decode, signal=signal
        )
        self._workers = KVMirror(registry.workers_kv, _worker_decoder.decode, signal=signal)
        self._owners: dict[str, dict[str, str]] = {}
        self._owners_at = (-1, 0.0)  # (registry version, monotonic time) the owners were computed at
        self._support: dict[tuple[str, str], tuple[bool, int, float]] = {}
        self._live_until: dict[tuple[str, str], tuple[int, float]] = {}

    async def start(self) -> None:
        """Load both buckets and keep following them; returns once the current contents are in memory."""
        await self._types.start()
        try:
            await self._workers.start()
        except BaseException:
            await self._types.stop()
            raise

    async def stop(self) -> None:
        await self._types.stop()
        await self._workers.stop()

    def _check_started(self) -> None:
        if not self._types.started:
            raise RuntimeError("RegistryCache is not started; await start() first")

    def get_type(self, namespace: str, agent_type: str) -> AgentTypeInfo | None:
        self._check_started()
        return self._types.items.get(_type_key(namespace, agent_type))

    def list_types(self, namespace: str | None = None) -> list[AgentTypeInfo]:
        self._check_started()
        types = [t for t in self._types.items.values() if namespace is None or t.namespace == namespace]
        return sorted(types, key=lambda t: (t.namespace, t.type))

    def capabilities(self, namespace: str, agent_type: str) -> list[str]:
        info = self.get_type(namespace, agent_type)
        if info is None:
            raise AgentTypeNotFoundError(namespace, agent_type)
        return list(info.capabilities)

    def find_by_capability(self, capability: str, namespace: str | None = None) -> list[AgentTypeInfo]:
        self._check_started()
        return _by_capability(self._types.items.values(), capability, namespace)

    def live_workers(self, ns_type: str | None = None) -> list[WorkerInfo]:
        self._check_started()
        return _live(self._workers.items.values(), self.ttl_s, ns_type)

    def topic_owner(self, namespace: str, agent_type: str) -> str | None:
        """The topic delivery group that handles `agent_type`'s copy of a publication: the least group name
        among live workers hosting it (every worker computes the same from the same bucket), or None when
        no live worker is known to host it."""
        self._check_started()
        now = time.monotonic()
        version, at = self._owners_at
        # Recomputed on any change of either bucket, and at least once a second (liveness is time-based).
        if version != self._signal.version or now - at > 1.0:
            owners: dict[str, dict[str, str]] = {}
            for worker in self.live_workers():
                for ref in worker.types:
                    ns, _, name = ref.partition("/")
                    group = worker.topic_groups.get(ns)
                    if group is not None:
                        per_ns = owners.setdefault(ns, {})
                        per_ns[name] = min(group, per_ns.get(name, group))
            self._owners, self._owners_at = owners, (self._signal.version, now)
        return self._owners.get(namespace, {}).get(agent_type)

    def supported_by_all(self, ref: str, feature: str) -> bool:
        """Whether every live worker hosting `ref` (``"ns/type"``) lists `feature` (False when none is
        known): during a rolling upgrade a new form of data is written only once no older reader is left."""
        self._check_started()
        now = time.monotonic()
        known = self._support.get((ref, feature))
        if known is not None and known[1] == self._signal.version and now - known[2] <= 1.0:
            return known[0]
        hosts = self.live_workers(ref)
        supported = bool(hosts) and all(feature in w.features for w in hosts)
        self._support[(ref, feature)] = (supported, self._signal.version, now)
        return supported

    def has_live_host(self, namespace: str, agent_type: str) -> bool:
        """Whether some live worker hosts ``namespace/type`` right now."""
        # Asked before every send. A host found live stays live until its heartbeat is a TTL old unless a
        # bucket changes first, so the answer is kept until then instead of scanning every worker again.
        key = (namespace, agent_type)
        known = self._live_until.get(key)
        if known is not None and known[0] == self._signal.version and time.time() <= known[1]:
            return True
        hosts = self.live_workers(type_ref(namespace, agent_type))
        if not hosts:
            return False
        if len(self._live_until) >= _LIVE_UNTIL_KEPT:
            self._live_until.clear()
        self._live_until[key] = (self._signal.version, max(w.heartbeat_at for w in hosts) + self.ttl_s)
        return True

    async def wait_for_host(self, namespace: str, agent_type: str, timeout: float) -> bool:
        """True as soon as a live worker hosts ``namespace/type``; False at the deadline."""
        return await self.wait_until(lambda: self.has_live_host(namespace, agent_type), timeout)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until `predicate()` holds, re-checked when either bucket changes; False at the deadline."""
        self._check_started()
        return await self._signal.wait_until(predicate, timeout)
