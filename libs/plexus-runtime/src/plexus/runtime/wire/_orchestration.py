"""The orchestration protocol: what workers and clients exchange with the orchestrator service.

It lives in the runtime (the service imports it; the runtime never imports the service). Every request goes
to a NATS micro-service endpoint under ``<prefix>.<ns>.orch.<verb>`` (queue group "q", discoverable through
``$SRV``); failures come back as micro error replies whose body is a `KernelError.to_wire()` dict, so the
caller re-raises the same typed error.

State the orchestrator owns (all in JetStream, none in one process's memory):
- `plexus_runs` KV: ``run.<run_id>`` → `RunRecord`, ``tree.<root_id>`` → `TreeRecord` (spawn slots), both
  written by compare-and-swap; ``input.<root_id>`` → the root's input payload (written once).
- `PLEXUS_COUNTERS` stream (``allow_msg_counter``): ``<prefix>.<ns>.ctr.<root>.<dimension>`` budget totals
  incremented atomically with ``Nats-Incr`` by every reporter, ``<prefix>.<ns>.ctr.run.<run>.<dimension>``
  the same usage per run (what each run spent itself, for its record), and ``<prefix>.<ns>.ctr.att.<message>``
  handler-start counters that reveal crashed attempts.
"""

from __future__ import annotations

import enum
import hashlib
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from plexus.core import BaseBlock, DataBlock, KernelError

from ._envelope import RunInfo

__all__ = [
    "APPROVAL_KEY",
    "BUDGET_DIMENSIONS",
    "ORCH_SERVICE_NAME",
    "ORCH_VERSION",
    "TERMINAL",
    "ApprovalRequired",
    "ApproveRequest",
    "CancelNotice",
    "CancelRequest",
    "CrashReport",
    "FinishedReport",
    "GetRunRequest",
    "InvalidRunRequest",
    "PauseNotice",
    "RunNotFoundError",
    "RunRecord",
    "RunStateError",
    "RunStatus",
    "Slot",
    "SpawnReply",
    "SpawnRequest",
    "StartRunReply",
    "StartRunRequest",
    "TreeRecord",
    "UsageTotals",
    "approval_blocks",
    "attempt_counter_subject",
    "budget_counter_subject",
    "cancel_subject",
    "decision_message_id",
    "input_key",
    "limited_dimensions",
    "orch_subject",
    "pause_subject",
    "run_counter_subject",
    "run_key",
    "tree_key",
]

ORCH_VERSION = 1
ORCH_SERVICE_NAME = "plexus-orchestrator"
#: Cost is counted in integer micro-units of the budget's currency (counters are integers).
COST_SCALE = 1_000_000
#: Each budget counter and the `ExecutionBudget` field that limits it.
BUDGET_DIMENSIONS = (("tokens", "max_tokens"), ("cost_micros", "max_cost_usd"), ("turns", "max_turns"))


def limited_dimensions(budget: dict[str, Any] | None) -> tuple[str, ...]:
    """The counters a budget (an `ExecutionBudget` as stored: a dict) limits; the others need no read."""
    limits = budget or {}
    return tuple(dimension for dimension, limit in BUDGET_DIMENSIONS if limits.get(limit) is not None)


_NULL = msgspec.Raw(b"null")

if TYPE_CHECKING:
    _OptionalRaw = msgspec.Raw | None
else:
    # msgspec cannot decode a `Raw | None` union (it accepts only null), so at runtime the field is a plain
    # Raw whose default is None; `_null_to_none` maps an explicit JSON null back to None after decoding.
    _OptionalRaw = msgspec.Raw


def _null_to_none(raw: msgspec.Raw | None) -> msgspec.Raw | None:
    return None if raw is None or raw == _NULL else raw


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: Ended on purpose by a guard (`MiddlewareTermination`): not a failure to retry or to page about.
    GUARDRAIL_TRIPPED = "guardrail_tripped"
    #: Its handler returned waiting for a decision (`Context.await_approval`); `Runtime.approve` resumes it.
    AWAITING_APPROVAL = "awaiting_approval"


TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.GUARDRAIL_TRIPPED}
)


class UsageTotals(msgspec.Struct, omit_defaults=True):
    tokens: int = 0
    cost_micros: int = 0
    turns: int = 0


class RunRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One run (the root or a child) of a run tree."""

    v: int = ORCH_VERSION
    run_id: str
    root_id: str
    parent_id: str | None = None
    depth: int = 0
    agent_id: str
    session_id: str | None = None
    status: RunStatus = RunStatus.PENDING
    reason: str | None = None
    priority: int = 2
    attempts: int = 0
    budget: dict[str, Any] | None = None  # ExecutionBudget JSON
    spawn_budget: dict[str, Any] | None = None  # SpawnBudget JSON
    retry: dict[str, Any] | None = None  # RetryPolicy JSON
    deadline: float | None = None  # epoch seconds
    created_at: float = 0.0
    updated_at: float = 0.0
    children: list[str] = []
    #: A root: its whole tree's totals (the budget's counters); a child: what it spent itself. Written when
    #: the run ends and caught up with usage reported after that until the tree settles (architecture.md).
    usage: UsageTotals = msgspec.field(default_factory=UsageTotals)
    #: What this run's own agent spent (a child's equals its ``usage``; a root's excludes its children's).
    own_usage: UsageTotals = msgspec.field(default_factory=UsageTotals)
    output: _OptionalRaw = None  # JSON array of content blocks (completed runs)
    error: dict[str, Any] | None = None  # KernelError.to_wire() (failed/cancelled runs)
    retry_at: float | None = None  # PENDING after a crash: when the worker starts the next attempt
    awaiting: list[str] = []  # AWAITING_APPROVAL: the decisions it waits for (e.g. tool call ids)
    #: The decisions of the same suspension already sent to its agent (never reopened by a late report).
    decided: list[str] = []
    #: The id of the suspension it waits (or last waited) in, as its agent named it (None: unnamed). Ids of a
    #: new one are undecided again, though an earlier one decided the same ids (a reused ``call_0``).
    suspension: str | None = None
    #: The named suspensions it waited in before ``suspension``, oldest first (the last 32): a late report of
    #: one of them (a retried or redelivered report) is ignored, never taken as a new wait.
    ended_suspensions: list[str] = []
    #: A forked root: its source (``run_id``, ``agent_id``, ``message``, ``turn``; docs/timetravel.md).
    forked_from: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.output = _null_to_none(self.output)


class Slot(msgspec.Struct, omit_defaults=True, kw_only=True):
    agent_id: str
    priority: int
    paused: bool = False
    preempted_by: str | None = None


class TreeRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Spawn accounting shared by the whole tree: active slots (root included) against `max_agents`."""

    v: int = ORCH_VERSION
    root_id: str
    max_agents: int
    allow_preempt: bool = True
    active: dict[str, Slot] = {}
    spawned_total: int = 0
    #: Every namespace a run of the tree was admitted in: their budget counters count after the runs end.
    namespaces: list[str] = []


# -- requests and replies -------------------------------------------------------------------------------
class StartRunRequest(msgspec.Struct, omit_defaults=True, kw_only=True):
    agent_id: str
    payload: msgspec.Raw  # JSON array of content blocks
    budget: dict[str, Any] | None = None
    spawn_budget: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    priority: int = 2
    session_id: str | None = None
    run_id: str | None = None  # idempotency: a repeated start with the same id returns the same run
    forked_from: dict[str, Any] | None = None  # `Runtime.fork_run`: the lineage kept on the new root


class StartRunReply(msgspec.Struct, kw_only=True):
    run_id: str
    status: RunStatus


class SpawnRequest(msgspec.Struct, omit_defaults=True, kw_only=True):
    parent_run_id: str
    root_id: str
    parent_agent: str
    child_agent: str
    priority: int | None = None
    child_run_id: str | None = None  # idempotency for a retried spawn


class SpawnReply(msgspec.Struct, omit_defaults=True, kw_only=True):
    run_id: str
    root_id: str
    parent_id: str
    depth: int
    priority: int
    session_id: str | None = None
    deadline: float | None = None
    budget: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    preempted: str | None = None  # run id of the agent paused to make room, if any

    def run_info(self) -> RunInfo:
        """The child's RunInfo, carried by its entry message."""
        return RunInfo(
            run_id=self.run_id,
            root_id=self.root_id,
            parent_id=self.parent_id,
            depth=self.depth,
            priority=self.priority,
            session_id=self.session_id,
            deadline=self.deadline,
            budget=self.budget,
            orchestrated=True,
            retry=self.retry,
        )


class FinishedReport(msgspec.Struct, omit_defaults=True, kw_only=True):
    run_id: str
    status: Literal["completed", "failed", "cancelled", "guardrail_tripped", "awaiting_approval"]
    output: _OptionalRaw = None  # JSON array of content blocks
    awaiting: list[str] = []  # what an awaiting_approval run waits for (tool call ids)
    suspension: str | None = None  # the id of that wait, when its agent names one
    error: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.output = _null_to_none(self.output)


class CrashReport(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A worker saw a crashed attempt (attempt counter > 1), or an attempt that failed with a retryable error
    (``cause``: its error type), and what it decided."""

    run_id: str
    agent_id: str
    message_id: str
    attempt: int
    decision: Literal["retry", "exhausted"]
    backoff_s: float = 0.0
    cause: str = ""  # empty: the attempt crashed (its worker died or lost its lease)


class CancelRequest(msgspec.Struct, kw_only=True):
    run_id: str
    reason: str = "cancelled"


class GetRunRequest(msgspec.Struct, kw_only=True):
    run_id: str


class ApproveRequest(msgspec.Struct, kw_only=True):
    """A decision on one thing an ``awaiting_approval`` run waits for (``id``: e.g. a tool call id)."""

    run_id: str
    id: str
    approved: bool = True
    reason: str = ""
    #: The suspension the decision is for (`RunRecord.suspension`); None: whichever the run waits in.
    suspension: str | None = None
    #: Who decided (a user, a token's name), recorded with the decision by the agent that takes it.
    decided_by: str | None = None


#: DataBlock key of a decision message (`approval_blocks`): what an awaiting agent receives from `approve`.
APPROVAL_KEY = "plexus.approval"


def approval_blocks(
    decision_id: str,
    approved: bool,
    reason: str = "",
    suspension: str | None = None,
    decided_by: str | None = None,
) -> list[BaseBlock]:
    """The message that carries one decision to the agent that awaits it (naming the suspension it is for,
    when known: the agent refuses it for another one; and who decided, when known)."""
    decision: dict[str, Any] = {"call_id": decision_id, "approved": approved, "reason": reason}
    if suspension is not None:
        decision["suspension"] = suspension
    if decided_by is not None:
        decision["decided_by"] = decided_by
    return [DataBlock(data={APPROVAL_KEY: decision})]


def decision_message_id(agent_id: str, call_id: str, approved: bool, suspension: str) -> str:
    """The inbox message id of a decision for an agent (not a run) that names its suspension: fixed per
    (agent, suspension, call, verdict), so a repeat (its answer lost) is stored once by the stream's dedupe,
    while a later suspension's decision on a reused call id, or the other verdict (which the agent refuses:
    the first decision stands), is a new message. Every client uses it, so theirs dedupe alike."""
    key = f"{agent_id}\n{suspension}\n{call_id}\n{approved}"
    return f"approve-{hashlib.sha256(key.encode()).hexdigest()[:32]}"


# -- typed error replies ------------------------------------------------------------------------------
class RunNotFoundError(KernelError):
    """No run with this id exists in `plexus_runs`."""

    fields = ("run_id",)

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"unknown run {run_id!r}")


class InvalidRunRequest(KernelError):
    """A request the orchestrator cannot accept as sent: not JSON, a missing or ill-typed field, a negative
    budget, a run that is not part of the tree it claims."""

    fields = ("verb", "problem")

    def __init__(self, verb: str, problem: str) -> None:
        self.verb = verb
        self.problem = problem
        super().__init__(f"invalid {verb} request: {problem}")


class RunStateError(KernelError):
    """The run is in a state that does not allow the action (e.g. spawning from a completed run)."""

    fields = ("run_id", "status", "action")

    def __init__(self, run_id: str, status: str, action: str) -> None:
        self.run_id = run_id
        self.status = status
        self.action = action
        super().__init__(f"cannot {action}: run {run_id} is {status}")


class ApprovalRequired(KernelError):
    """The message was handled and its agent now waits for decisions (`Context.await_approval`): there is no
    answer yet. `call_ids` are what it waits for; `calls` describe them as the agent reported them (JSON
    objects with at least ``call_id``; an LLMAgent adds ``tool_name`` and ``arguments``). Decide each with
    `plexus.llm.approve` / `deny` (or `Runtime.approve` for a run); the agent's answer comes after the last.
    Raised by `Runtime.send_message`, not by the agent: its suspended state is committed like any reply."""

    fields = ("agent_id", "call_ids", "calls")

    def __init__(self, agent_id: str, call_ids: list[str], calls: list[dict[str, Any]] | None = None) -> None:
        self.agent_id = str(agent_id)
        self.call_ids = list(call_ids)
        self.calls = [dict(c) for c in calls] if calls is not None else [{"call_id": i} for i in call_ids]
        super().__init__(f"{self.agent_id} awaits approval of {', '.join(self.call_ids)}")

    @classmethod
    def of_reply(cls, agent_id: str, awaiting: list[str], blocks: list[BaseBlock]) -> ApprovalRequired:
        """The error for a reply that ended awaiting `awaiting`; a reply that is one DataBlock with a list of
        objects under ``calls`` (an LLMAgent's) describes them (those of `awaiting`: a run's record may still
        hold the reply from before some were decided)."""
        calls: list[dict[str, Any]] | None = None
        if len(blocks) == 1 and isinstance(blocks[0], DataBlock):
            listed = blocks[0].data.get("calls")
            if isinstance(listed, list) and all(isinstance(c, dict) for c in listed):
                calls = [dict(c) for c in listed if isinstance(c, dict) and c.get("call_id") in awaiting]
        return cls(agent_id, awaiting, calls)


# -- broadcasts ---------------------------------------------------------------------------------------
class CancelNotice(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Published on `cancel_subject(root)`: every agent of the tree cancels its token with `error`."""

    root_id: str
    run_id: str
    reason: str
    error: dict[str, Any] | None = None  # the KernelError agents should see (Cancellation/BudgetExhausted)


class PauseNotice(msgspec.Struct, kw_only=True):
    root_id: str
    run_id: str
    paused: bool


# -- names --------------------------------------------------------------------------------------------
def orch_subject(prefix: str, namespace_token: str, verb: str) -> str:
    return f"{prefix}.{namespace_token}.orch.{verb}"


def cancel_subject(prefix: str, namespace_token: str, root_token: str) -> str:
    return f"{prefix}.{namespace_token}.ctl.cancel.{root_token}"


def pause_subject(prefix: str, namespace_token: str, root_token: str) -> str:
    return f"{prefix}.{namespace_token}.ctl.pause.{root_token}"


def budget_counter_subject(prefix: str, namespace_token: str, root_token: str, dimension: str) -> str:
    return f"{prefix}.{namespace_token}.ctr.{root_token}.{dimension}"


def run_counter_subject(prefix: str, namespace_token: str, run_token: str, dimension: str) -> str:
    """One run's own usage (three tokens after ``ctr``: never a tree's, whose root may be named "run")."""
    return f"{prefix}.{namespace_token}.ctr.run.{run_token}.{dimension}"


def attempt_counter_subject(prefix: str, namespace_token: str, message_token: str) -> str:
    return f"{prefix}.{namespace_token}.ctr.att.{message_token}"


def run_key(run_token: str) -> str:
    return f"run.{run_token}"


def tree_key(root_token: str) -> str:
    return f"tree.{root_token}"


def input_key(run_token: str) -> str:
    """The root run's input payload, kept so any orchestrator replica can (re)dispatch the run."""
    return f"input.{run_token}"
