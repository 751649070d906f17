"""``/v1`` agents, workers, messages and runs (the run tree's SSE stream included)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request
from pydantic import StringConstraints
from sse_starlette import EventSourceResponse

from plexus.core import AgentId, BaseBlock, MessageId, content_block_to_dict
from plexus.runtime.orchestration import RunStatus, approval_blocks, decision_message_id

from ._changes import run_changes
from ._events import EVENT_ID_PATTERN, parse_event_id, tree_events
from ._models import (
    AgentTypeOut,
    DecisionIn,
    DecisionOut,
    MessageIn,
    MessageOut,
    RunCreated,
    RunsPage,
    StartRun,
    WorkerOut,
)
from ._problems import PROBLEM_RESPONSES, Problem
from ._runs import RunFilter, budget_view, partitions_by_worker
from ._state import GatewayState, authorize, caller_name, state

__all__ = ["router", "sse_response", "tree_root"]

router = APIRouter(prefix="/v1", dependencies=[Depends(authorize)], responses=PROBLEM_RESPONSES)

Gw = Annotated[GatewayState, Depends(state)]
RunIdPath = Annotated[str, Path(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_\-.:]+$")]
NamePath = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-]+$")]
KeyPath = Annotated[str, Path(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_\-.:]+$")]
#: A tool call id as providers make them (``call_0``, ``toolu_01...``, ``call_abc-1``).
CallIdPath = Annotated[str, Path(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_\-.:]+$")]
SSE_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}
_RUN_ID = r"[A-Za-z0-9_\-.:]+"
_STATUS = "(" + "|".join(sorted(RunStatus)) + ")?"
#: What `list_runs` gives as next_cursor: the last run's created_at (repr of a float) and its run id.
_CURSOR = r"^[0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?~" + _RUN_ID + "$"
_EVENT_ID_DOC = (
    "resume after this event: `<seq>` (a durable event: its JetStream sequence) or `<seq>.<n>` (the n-th "
    "event after it that is not durable: a token delta, a reconciled status, [DONE]); empty: from the start"
)


def _blocks(blocks: list[BaseBlock]) -> list[dict[str, Any]]:
    return [content_block_to_dict(b) for b in blocks]


# -- agents and workers ----------------------------------------------------------------------------------
@router.get(
    "/agents", response_model=list[AgentTypeOut], summary="agent types and the live workers hosting them"
)
async def list_agents(
    gw: Gw, namespace: Annotated[str | None, Query(max_length=128)] = None
) -> list[AgentTypeOut]:
    types = await gw.rt.agent_types(namespace)
    workers = await gw.rt.registry.live_workers()
    return [
        AgentTypeOut(
            namespace=t.namespace,
            type=t.type,
            description=t.description,
            capabilities=list(t.capabilities),
            workers=sorted(w.worker_id for w in workers if w.hosts(t.ref)),
        )
        for t in sorted(types, key=lambda t: t.ref)
    ]


@router.get(
    "/workers",
    response_model=list[WorkerOut],
    summary="live workers (by heartbeat) and the partitions they own",
)
async def list_workers(gw: Gw) -> list[WorkerOut]:
    workers = await gw.rt.registry.live_workers()
    owned = await partitions_by_worker(gw.rt)
    return [
        WorkerOut(
            worker_id=w.worker_id,
            types=list(w.types),
            partitions=owned.get(w.worker_id, {}),
            detail=msgspec.to_builtins(w),
        )
        for w in sorted(workers, key=lambda w: w.worker_id)
    ]


@router.post(
    "/agents/{agent_type}/{key}/messages",
    response_model=MessageOut,
    summary="RPC: send input blocks to one agent and wait for its reply",
)
async def send_message(gw: Gw, agent_type: NamePath, key: KeyPath, body: MessageIn) -> MessageOut:
    agent_id = _agent_id(agent_type, key, gw.rt.namespace)
    reply = await gw.rt.send_message(list(body.input), agent_id, timeout=body.timeout_s)
    return MessageOut(agent_id=str(agent_id), output=_blocks(reply))


@router.post(
    "/agents/{agent_type}/{key}/approvals/{call_id}",
    response_model=DecisionOut,
    summary="decide one tool call a (non-run) agent awaits approval for (its 409 ApprovalRequired)",
)
async def decide_call(
    gw: Gw, request: Request, agent_type: NamePath, key: KeyPath, call_id: CallIdPath, body: DecisionIn
) -> DecisionOut:
    agent_id = _agent_id(agent_type, key, gw.rt.namespace)
    by = body.decided_by or caller_name(request)
    blocks = approval_blocks(call_id, body.approved, body.reason, body.suspension, by)
    out = DecisionOut(agent_id=str(agent_id), call_id=call_id, approved=body.approved)
    if body.wait:
        out.output = _blocks(await gw.rt.send_message(blocks, agent_id, timeout=body.timeout_s))
        return out
    # Stored in the agent's inbox stream, no live worker needed; named, a repeat is one message (the
    # stream's dedupe) while a later suspension's decision on a reused call id is another.
    message_id = str(MessageId.new())
    if body.suspension is not None:
        message_id = decision_message_id(str(agent_id), call_id, body.approved, body.suspension)
    await gw.rt.post_message(blocks, agent_id, message_id=message_id, timeout=min(body.timeout_s, 30.0))
    return out


def _agent_id(agent_type: str, key: str, namespace: str) -> AgentId:
    try:
        return AgentId(agent_type, key, namespace)
    except ValueError as exc:
        raise Problem(422, "Invalid agent id", str(exc)) from None


# -- runs ------------------------------------------------------------------------------------------------
@router.post("/runs", response_model=RunCreated, status_code=201, summary="start a run tree")
async def start_run(gw: Gw, body: StartRun) -> RunCreated:
    run_id = await gw.rt.start_run(
        AgentId.parse(body.agent_id),
        list(body.input),
        budget=body.budget,
        spawn_budget=body.spawn_budget,
        priority=body.priority,
        run_id=body.run_id,
    )
    return RunCreated(run_id=run_id, events=f"/v1/runs/{run_id}/events")


def _cursor(text: str | None) -> tuple[float, str] | None:
    if text is None:
        return None
    created, sep, run_id = text.partition("~")
    try:
        value = float(created)
    except ValueError:
        value = float("nan")
    if not sep or not run_id or value != value:
        raise Problem(422, "Invalid cursor", "pass back the next_cursor of the previous page unchanged")
    return value, run_id


@router.get("/runs", response_model=RunsPage, summary="runs, newest first, filtered and paginated")
async def list_runs(
    gw: Gw,
    status: Annotated[
        list[Annotated[str, StringConstraints(pattern=f"^{_STATUS}(,{_STATUS})*$")]] | None,
        Query(description="any of " + ", ".join(RunStatus) + ", or several comma-separated"),
    ] = None,
    agent_type: Annotated[str | None, Query(max_length=128)] = None,
    since: Annotated[float | None, Query(ge=0, le=1e11, description="epoch seconds")] = None,
    roots_only: bool = False,
    session_id: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        str | None, Query(max_length=300, pattern=_CURSOR, description="the next_cursor of the previous page")
    ] = None,
) -> RunsPage:
    statuses = frozenset(s for item in status or [] for s in item.split(",") if s)
    unknown = statuses - {str(s) for s in RunStatus}
    if unknown:
        raise Problem(422, "Invalid status filter", f"unknown status {sorted(unknown)}")
    flt = RunFilter(statuses, agent_type, since, roots_only, session_id)
    page, nxt = await gw.runs.page(flt, min(limit, gw.config.max_page), _cursor(cursor))
    return RunsPage(runs=page, next_cursor=f"{nxt[0]!r}~{nxt[1]}" if nxt else None)


async def _record(gw: GatewayState, run_id: str) -> dict[str, Any]:
    record = await gw.runs.record(run_id)
    if record is None:
        raise Problem(
            404,
            "RunNotFoundError",
            f"unknown run {run_id!r}",
            error_type="RunNotFoundError",
            fields={"run_id": run_id},
        )
    return record


async def tree_root(gw: GatewayState, run_id: str) -> dict[str, Any]:
    record = await _record(gw, run_id)
    if record.get("root_id") and record["root_id"] != record["run_id"]:
        return await _record(gw, str(record["root_id"]))
    return record


@router.get(
    "/runs/changes",
    summary="SSE: an event naming the runs whose records changed, as they change (a live runs list)",
    response_class=EventSourceResponse,
)
async def runs_changes(gw: Gw) -> EventSourceResponse:
    # Declared before /runs/{run_id}, which would otherwise take "changes" for a run id.
    return EventSourceResponse(run_changes(gw.rt), ping=gw.config.heartbeat_s, headers=SSE_HEADERS)


@router.get(
    "/runs/{run_id}",
    summary="one run: its record, its tree's usage against the budget, and its token figures labelled "
    "(tokens.own: what its own agent spent; tokens.tree: its whole tree's total)",
)
async def get_run(gw: Gw, run_id: RunIdPath) -> dict[str, Any]:
    record = await _record(gw, run_id)
    root = await tree_root(gw, run_id)
    usage = await gw.runs.usage(root)
    tokens = {"own": (await gw.runs.tokens(record))["own"], "tree": usage["tokens"]}
    return {"run": record, "usage": usage, "budget": budget_view(root, usage), "tokens": tokens}


@router.get("/runs/{run_id}/tree", summary="every run of the tree (root first)")
async def get_tree(gw: Gw, run_id: RunIdPath) -> dict[str, Any]:
    root = await tree_root(gw, run_id)
    runs = await gw.runs.tree(root)
    usage = await gw.runs.usage(root)
    return {"root_id": root["run_id"], "runs": runs, "usage": usage, "budget": budget_view(root, usage)}


@router.post("/runs/{run_id}/cancel", summary="cancel the whole run tree")
async def cancel_run(
    gw: Gw,
    run_id: RunIdPath,
    reason: Annotated[str, Body(embed=True, min_length=1, max_length=500)] = "cancelled from the gateway",
) -> dict[str, Any]:
    root = await tree_root(gw, run_id)
    record = await gw.rt.cancel_run(str(root["run_id"]), reason)
    return {"run": _as_json(record)}


@router.post(
    "/runs/{run_id}/approve",
    summary="decide one thing an awaiting_approval run waits for (e.g. a tool call)",
)
async def approve_run(
    gw: Gw,
    request: Request,
    run_id: RunIdPath,
    decision_id: Annotated[str, Body(min_length=1, max_length=500, description="e.g. a tool call id")],
    approved: Annotated[bool, Body(strict=True)] = True,
    reason: Annotated[str, Body(max_length=500)] = "",
    suspension: Annotated[
        str | None,
        Body(
            min_length=1,
            max_length=500,
            description="the wait it is for (run.suspension): 409 once that has ended",
        ),
    ] = None,
    decided_by: Annotated[
        str | None,
        Body(
            min_length=1,
            max_length=200,
            description="who decided, recorded with the decision (default: the bearer token's name)",
        ),
    ] = None,
) -> dict[str, Any]:
    # Never the gateway's own NATS user: "" when the caller is not known says so.
    by = decided_by or caller_name(request) or ""
    record = await gw.rt.approve(
        run_id, decision_id, approved=approved, reason=reason, suspension=suspension, decided_by=by
    )
    return {"run": _as_json(record)}


def _as_json(record: object) -> Any:
    """A run record as JSON values (its `output` is raw JSON, which `to_builtins` cannot convert)."""
    return msgspec.json.decode(msgspec.json.encode(record))


def _last_event_id(header: str | None, query: str | None) -> tuple[int, int] | None:
    raw = header or query
    if not raw:
        return None
    try:
        return parse_event_id(raw)
    except ValueError as exc:
        raise Problem(422, "Invalid Last-Event-ID", str(exc)) from None


def sse_response(
    gw: GatewayState, root: dict[str, Any], last_event_id: tuple[int, int] | None
) -> EventSourceResponse:
    # A viewer going away only stops this generator; the run is never touched.
    return EventSourceResponse(
        tree_events(gw.rt, root, last_event_id),
        ping=gw.config.heartbeat_s,
        headers=SSE_HEADERS,
    )


@router.get(
    "/runs/{run_id}/events",
    summary="SSE of the whole tree: snapshot, then live events; resumable with Last-Event-ID",
    response_class=EventSourceResponse,
)
async def run_events(
    gw: Gw,
    run_id: RunIdPath,
    last_event_id: Annotated[
        str | None, Header(pattern=f"^$|{EVENT_ID_PATTERN}", description=_EVENT_ID_DOC)
    ] = None,
    from_id: Annotated[
        str | None,
        Query(
            alias="last_event_id",
            pattern=f"^$|{EVENT_ID_PATTERN}",
            description="the same, for a browser's `EventSource` (it cannot send headers)",
        ),
    ] = None,
) -> EventSourceResponse:
    root = await tree_root(gw, run_id)
    return sse_response(gw, root, _last_event_id(last_event_id, from_id))
