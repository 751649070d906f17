"""`TypeResolver`: which registered agent type a message goes to, and whether a live worker hosts it.

A send waits (up to its deadline) for a registered type to get a live host; a type the registry has never
seen fails fast with `AgentNotFoundError` (no grace period helps a misspelt name). Lookups go to the shared,
watch-fed `RegistryCache` first and to the registry's buckets only when it has no answer.
"""

from __future__ import annotations

import contextlib
import time

from nats.errors import TimeoutError as NatsTimeoutError

from plexus.core import AgentId, AgentNotFoundError, KernelError
from plexus.runtime.store._registry import AgentTypeInfo, Registry, RegistryCache

__all__ = ["TypeResolver"]

#: Time kept at the end of a host lookup for one direct read of the registry.
_DIRECT_CHECK_S = 1.0


class TypeResolver:
    """Agent-type lookups of one `Runtime` (its registry and the cache that follows it)."""

    __slots__ = ("_cache", "_registry")

    def __init__(self, registry: Registry, cache: RegistryCache) -> None:
        self._registry = registry
        self._cache = cache

    async def host_for(
        self, agent_id: AgentId, deadline: float, *, wait_for_unknown: bool = False
    ) -> AgentTypeInfo:
        """The registered type of `agent_id` once it has a live host, else AgentNotFoundError by `deadline`
        (at once for a type never registered, unless `wait_for_unknown`)."""
        info = self._cache.get_type(agent_id.namespace, agent_id.type)
        if info is not None and self._cache.has_live_host(agent_id.namespace, agent_id.type):
            return info
        if info is None and not wait_for_unknown:
            await self.require_known(agent_id)
        # Wait on the shared, watch-fed cache: a private watch per waiting send made one consumer per call,
        # and under a burst of sends during an outage ran the stream out of consumers.
        remaining = max(deadline - time.monotonic() - _DIRECT_CHECK_S, 0.0)
        if await self._cache.wait_for_host(agent_id.namespace, agent_id.type, remaining):
            info = self._cache.get_type(agent_id.namespace, agent_id.type)
            if info is not None:
                return info
        # Last, ask the bucket itself: the cache may lag behind a watch that is being re-established.
        with contextlib.suppress(KernelError, TimeoutError, NatsTimeoutError):
            ref = f"{agent_id.namespace}/{agent_id.type}"
            if await self._registry.live_workers(ref):
                found = await self._registry.get_type(agent_id.namespace, agent_id.type)
                if found is not None:
                    return found
        if self._cache.get_type(agent_id.namespace, agent_id.type) is None:
            known = [t.type for t in self._cache.list_types(agent_id.namespace)]
            raise AgentNotFoundError.unregistered(agent_id, agent_id.type, known)
        raise AgentNotFoundError(agent_id, registered=True)

    async def require_known(self, agent_id: AgentId) -> None:
        """AgentNotFoundError at once when the registry has never seen `agent_id`'s type (not registered,
        hosted by no live worker): no grace period helps a misspelt name. The cache missed it, so the
        buckets are read once more first (a worker may have registered it a moment ago, before the watch
        delivered it); a read that fails leaves the send its grace period."""
        ns, name = agent_id.namespace, agent_id.type
        if self._cache.live_workers(f"{ns}/{name}"):
            return
        try:
            if await self._registry.get_type(ns, name) is not None or await self._registry.live_workers(
                f"{ns}/{name}"
            ):
                return
        except Exception:  # an outage, say: not proof that the type is unknown
            return
        known = [t.type for t in self._cache.list_types(ns)]
        raise AgentNotFoundError.unregistered(agent_id, name, known)

    async def registered(self, agent_id: AgentId) -> AgentTypeInfo:
        """The registered type of `agent_id`, live host or not (AgentNotFoundError if there is none)."""
        ns, name = agent_id.namespace, agent_id.type
        info = self._cache.get_type(ns, name) or await self._registry.get_type(ns, name)
        if info is None:
            known = [t.type for t in self._cache.list_types(ns)]
            raise AgentNotFoundError.unregistered(agent_id, name, known)
        return info
