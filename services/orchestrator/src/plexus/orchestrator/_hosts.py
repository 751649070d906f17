"""Runs whose agent type nobody can serve (issue 9 item 8).

A type the registry has never seen (not registered, hosted by no live worker) is refused by `start` at
once with `AgentNotFoundError`, naming the registered types and the closest one: no grace period helps a
misspelt name. A `durable=False` type cannot be orchestrated (its inbox is a core-NATS queue group, not the
durable inbox the orchestrator dispatches to): `start` refuses it too. A durable type with
no live worker is accepted — as a Temporal workflow on a task queue waits for a worker — but not forever:
a root run whose type no live worker has hosted for `grace_s` fails with `AgentNotFoundError`.
"""

from __future__ import annotations

from collections.abc import Iterable

from plexus.core import AgentId, AgentNotFoundError
from plexus.runtime.kernel import Registry
from plexus.runtime.orchestration import InvalidRunRequest, RunRecord

__all__ = ["HostCheck"]


class HostCheck:
    """Registry lookups for `start` and the sweeper. The grace timers are per replica (a replica that
    restarts begins them again: a late failure, never a wrong one)."""

    def __init__(self, registry: Registry, grace_s: float) -> None:
        self.registry = registry
        self.grace_s = grace_s
        self._unhosted_since: dict[str, float] = {}

    async def refuse_stateless(self, agent: AgentId) -> None:
        """Raise for a type `start` must refuse: stateless, or unknown to the registry."""
        info = await self.registry.get_type(agent.namespace, agent.type)
        if info is None:
            # Read from the buckets, not a cache: a worker that registered a moment ago is seen.
            if not await self.registry.live_workers(f"{agent.namespace}/{agent.type}"):
                known = [t.type for t in await self.registry.list_types(agent.namespace)]
                raise AgentNotFoundError.unregistered(str(agent), agent.type, known)
            return
        if not info.durable:
            raise InvalidRunRequest(
                "start",
                f"agent type {agent.namespace}/{agent.type} is stateless (durable=False): its messages use a"
                " core-NATS queue group and cannot be orchestrated; call it with send_message",
            )

    async def unhosted(self, roots: Iterable[RunRecord], now: float) -> list[RunRecord]:
        """The roots whose type has had no live host for at least the grace period."""
        roots = list(roots)
        if not roots:
            self._unhosted_since.clear()
            return []
        hosted = {ref for worker in await self.registry.live_workers() for ref in worker.types}
        overdue: list[RunRecord] = []
        for root in roots:
            agent = AgentId.parse(root.agent_id)
            if f"{agent.namespace}/{agent.type}" in hosted:
                self._unhosted_since.pop(root.run_id, None)
                continue
            since = self._unhosted_since.setdefault(root.run_id, now)
            if now - since >= self.grace_s:
                overdue.append(root)
        live = {root.run_id for root in roots}
        for run_id in [r for r in self._unhosted_since if r not in live]:
            del self._unhosted_since[run_id]
        return overdue
