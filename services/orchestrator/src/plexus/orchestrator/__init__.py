"""Plexus orchestrator: a replicated service that owns run trees — retries, budgets, spawn limits,
cancellation and deadlines — with all state in JetStream (`plexus_runs`, `PLEXUS_COUNTERS`).

Run ``plexus orchestrator --nats URL`` (as many replicas as you like) or embed an `Orchestrator`.
"""

from __future__ import annotations

from ._budget import BudgetWatcher, budget_error, read_usage
from ._engine import Engine, EngineConfig, tree_error
from ._events import ORCHESTRATOR_TYPE, Announcer, RunDecision
from ._orchestrator import Orchestrator, OrchestratorConfig
from ._service import VERBS, OrchestratorService, error_code
from ._spawn import Admission, admit, choose_victim, release, running_count
from ._store import CasConflictError, Changed, RunStore
from ._sweeper import RunIndex, Sweeper, SweeperConfig

__all__ = [
    "ORCHESTRATOR_TYPE",
    "VERBS",
    "Admission",
    "Announcer",
    "BudgetWatcher",
    "CasConflictError",
    "Changed",
    "Engine",
    "EngineConfig",
    "Orchestrator",
    "OrchestratorConfig",
    "OrchestratorService",
    "RunDecision",
    "RunIndex",
    "RunStore",
    "Sweeper",
    "SweeperConfig",
    "admit",
    "budget_error",
    "choose_victim",
    "error_code",
    "read_usage",
    "release",
    "running_count",
    "tree_error",
]
