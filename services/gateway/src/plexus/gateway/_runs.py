"""Read-only views of run trees, straight from JetStream (the orchestrator writes them; we never do).

The runtime's `Runtime.get_run` asks an orchestrator replica; listing runs, walking a tree and reading a
tree's live usage counters have no client call yet, so they read the ``plexus_runs`` KV bucket and the
counters stream through the Runtime's public ``topology`` and ``js`` objects. Records are kept as the JSON
the orchestrator wrote (plain dicts), so a field added by a newer orchestrator passes through untouched.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from nats.js.errors import KeyNotFoundError, NotFoundError

from plexus.core import AgentId
from plexus.runtime import Runtime
from plexus.runtime.kernel import escape_token, unescape_token
from plexus.runtime.orchestration import TERMINAL as _TERMINAL

from ._kv import keys_matching

__all__ = ["TERMINAL", "RunFilter", "RunsView", "budget_view", "partitions_by_worker", "stored_tokens"]

#: The ended statuses as plain strings (run records reach the gateway as JSON).
TERMINAL = frozenset(str(status) for status in _TERMINAL)
#: The orchestrator's usage counters per tree, in the order the budget checks them.
DIMENSIONS = ("tokens", "cost_micros", "turns")
COST_SCALE = 1_000_000


@dataclass(frozen=True)
class RunFilter:
    status: frozenset[str] = frozenset()
    agent_type: str | None = None
    since: float | None = None
    roots_only: bool = False
    session_id: str | None = None

    def matches(self, record: dict[str, Any]) -> bool:
        if self.status and record.get("status", "pending") not in self.status:
            return False
        if self.roots_only and record.get("parent_id"):
            return False
        if self.session_id is not None and record.get("session_id") != self.session_id:
            return False
        if self.since is not None and float(record.get("created_at", 0.0)) < self.since:
            return False
        if self.agent_type is not None:
            try:
                return AgentId.parse(str(record.get("agent_id", ""))).type == self.agent_type
            except ValueError:
                return False
        return True


def _decode(value: bytes | None) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        loaded = json.loads(value)
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) and "run_id" in loaded else None


def budget_view(record: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    """Usage against the ExecutionBudget, one entry per dimension (limit None = unlimited)."""
    budget = record.get("budget") or {}
    cost_limit = budget.get("max_cost_usd")
    return {
        "tokens": {"used": usage.get("tokens", 0), "limit": budget.get("max_tokens")},
        "turns": {"used": usage.get("turns", 0), "limit": budget.get("max_turns")},
        "cost_usd": {"used": usage.get("cost_micros", 0) / COST_SCALE, "limit": cost_limit},
        "deadline_s": {"limit": budget.get("deadline_s"), "deadline": record.get("deadline")},
    }


def stored_tokens(record: dict[str, Any]) -> dict[str, int | None]:
    """The token figures a run record holds, labelled: ``own`` (what the run's own agent spent) and ``tree``
    (its whole tree's total: a root's ``usage``; None for a child, whose ``usage`` is its own)."""
    usage = int((record.get("usage") or {}).get("tokens", 0))
    own = record.get("own_usage")
    if record.get("parent_id"):
        return {"own": max(usage, int((own or {}).get("tokens", 0))), "tree": None}
    return {"own": int((own or {}).get("tokens", 0)), "tree": usage}


class RunsView:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def record(self, run_id: str) -> dict[str, Any] | None:
        try:
            entry = await self.rt.topology.runs.get(f"run.{escape_token(run_id)}")
        except (KeyNotFoundError, NotFoundError):
            return None
        return _decode(entry.value)

    async def all_records(self) -> list[dict[str, Any]]:
        keys = await keys_matching(self.rt.topology.runs, "run.>")
        entries = await asyncio.gather(*(self._get(k) for k in keys))
        return [e for e in entries if e is not None]

    async def _get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = await self.rt.topology.runs.get(key)
        except (KeyNotFoundError, NotFoundError):
            return None  # deleted between the listing and the read
        return _decode(entry.value)

    async def page(
        self, flt: RunFilter, limit: int, cursor: tuple[float, str] | None
    ) -> tuple[list[dict[str, Any]], tuple[float, str] | None]:
        """Newest first; ``cursor`` is the (created_at, run_id) of the last run of the previous page."""
        records = [r for r in await self.all_records() if flt.matches(r)]
        records.sort(key=lambda r: (float(r.get("created_at", 0.0)), str(r["run_id"])), reverse=True)
        if cursor is not None:
            records = [r for r in records if (float(r.get("created_at", 0.0)), str(r["run_id"])) < cursor]
        page = records[:limit]
        more = len(records) > limit
        last = page[-1] if page else None
        next_cursor = (float(last.get("created_at", 0.0)), str(last["run_id"])) if more and last else None
        return page, next_cursor

    async def tree(self, root: dict[str, Any]) -> list[dict[str, Any]]:
        """Every run of the tree under ``root`` (root first, then breadth first by spawn order)."""
        out = [root]
        frontier = [root]
        while frontier:
            child_ids = [c for r in frontier for c in r.get("children", [])]
            found = await asyncio.gather(*(self.record(c) for c in child_ids))
            frontier = [r for r in found if r is not None]
            out.extend(frontier)
        return out

    async def usage(self, root: dict[str, Any]) -> dict[str, int]:
        """The tree's live totals from the orchestrator's counters (namespace of the root agent)."""
        try:
            namespace = AgentId.parse(str(root.get("agent_id", ""))).namespace
        except ValueError:
            namespace = self.rt.namespace
        base = f"{self.rt.prefix}.{escape_token(namespace)}.ctr.{escape_token(str(root['run_id']))}"
        stream = self.rt.topology.names.counters_stream
        values = await asyncio.gather(*(self._counter(stream, f"{base}.{d}") for d in DIMENSIONS))
        live = dict(zip(DIMENSIONS, values, strict=True))
        # The record's totals are written when the run ends; take whichever saw more.
        stored = root.get("usage") or {}
        return {d: max(live[d], int(stored.get(d, 0))) for d in DIMENSIONS}

    async def tokens(self, record: dict[str, Any]) -> dict[str, int | None]:
        """`stored_tokens`, live: each figure the larger of the record's and its counter's (a live run's
        record holds what it had when it started; an ended one's catches up as its tree settles)."""
        stored = stored_tokens(record)
        namespace = escape_token(self._namespace(record))
        stream = self.rt.topology.names.counters_stream
        own = await self._counter(
            stream, f"{self.rt.prefix}.{namespace}.ctr.run.{escape_token(str(record['run_id']))}.tokens"
        )
        figures: dict[str, int | None] = {"own": max(own, stored["own"] or 0), "tree": None}
        if not record.get("parent_id"):
            figures["tree"] = (await self.usage(record))["tokens"]
        return figures

    def _namespace(self, record: dict[str, Any]) -> str:
        try:
            return AgentId.parse(str(record.get("agent_id", ""))).namespace
        except ValueError:
            return self.rt.namespace

    def counters_subject(self, root: dict[str, Any]) -> str:
        """Where the tree's usage counters are incremented (every dimension)."""
        try:
            namespace = AgentId.parse(str(root.get("agent_id", ""))).namespace
        except ValueError:
            namespace = self.rt.namespace
        return f"{self.rt.prefix}.{escape_token(namespace)}.ctr.{escape_token(str(root['run_id']))}.*"

    async def _counter(self, stream: str, subject: str) -> int:
        try:
            msg = await self.rt.js.get_last_msg(stream, subject)
        except NotFoundError:
            return 0
        try:
            return int(json.loads(msg.data or b"{}")["val"])
        except (ValueError, KeyError, TypeError):
            return 0


async def partitions_by_worker(rt: Runtime) -> dict[str, dict[str, list[int]]]:
    """worker id -> {"ns/type": [partitions]} from the leases in ``plexus_leases`` (key ``<ns>.<type>.<p>``,
    value ``{"owner": worker id, ...}``); keys of another shape are skipped."""
    out: dict[str, dict[str, list[int]]] = {}
    for key in await keys_matching(rt.topology.leases, ">"):
        parts = key.split(".")
        if len(parts) != 3 or not parts[2].isdigit():
            continue
        try:
            entry = await rt.topology.leases.get(key)
            owner = str(json.loads(entry.value or b"{}")["owner"])
        except (KeyNotFoundError, NotFoundError, ValueError, KeyError, TypeError):
            continue  # released or expired while we listed
        ref = f"{unescape_token(parts[0])}/{unescape_token(parts[1])}"
        out.setdefault(owner, {}).setdefault(ref, []).append(int(parts[2]))
    for refs in out.values():
        for ps in refs.values():
            ps.sort()
    return out
