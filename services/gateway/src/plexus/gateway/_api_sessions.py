"""``/v1/sessions``: create, list, show (transcript + memory keys), memory CRUD, and run-with-SSE."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Response
from pydantic import JsonValue
from sse_starlette import EventSourceResponse

from plexus.core import AgentId, AgentNotFoundError, RunId, content_blocks_from_json

from ._api_runs import sse_response
from ._models import CreateSession, SessionOut, SessionRunIn
from ._problems import PROBLEM_RESPONSES, Problem
from ._runs import TERMINAL
from ._session_tools import tool_items
from ._sessions import RUN_ID_KEY, SessionNotFound, SessionStore, ending_item, user_item
from ._state import GatewayState, authorize, state

__all__ = ["router"]

log = logging.getLogger("plexus.gateway")

router = APIRouter(prefix="/v1/sessions", dependencies=[Depends(authorize)], responses=PROBLEM_RESPONSES)

Gw = Annotated[GatewayState, Depends(state)]
SessionPath = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-]+$")]
MemoryKey = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-]+$")]


async def _meta(store: SessionStore, session_id: str) -> dict[str, Any]:
    try:
        return await store.get(session_id)
    except SessionNotFound:
        raise Problem(
            404, "SessionNotFound", f"unknown session {session_id!r}", session_id=session_id
        ) from None


@router.post("", status_code=201, summary="create a session (optionally the child of another)")
async def create_session(gw: Gw, body: CreateSession) -> dict[str, Any]:
    store = gw.session_store()
    namespace = gw.rt.namespace
    if await gw.rt.registry.get_type(namespace, body.agent_type) is None:
        known = [t.type for t in await gw.rt.agent_types(namespace)]
        raise AgentNotFoundError.unregistered(f"{namespace}/{body.agent_type}", body.agent_type, known)
    if body.parent_id is not None:
        await _meta(store, body.parent_id)
    return await store.create(body.agent_type, body.parent_id, body.title)


@router.get("", summary="sessions, newest first")
async def list_sessions(gw: Gw) -> list[dict[str, Any]]:
    return await gw.session_store().all()


async def reconcile(gw: GatewayState, session_id: str) -> None:
    """Write the ending of every run of the session that ended but is not in the transcript yet (the
    replica that streamed it may have died before writing it)."""
    store = gw.session_store()
    items = await store.transcript(session_id)
    started = [
        str(i.metadata.get(RUN_ID_KEY)) for i in items if i.kind.value == "user" and RUN_ID_KEY in i.metadata
    ]
    ended = {str(i.metadata.get(RUN_ID_KEY)) for i in items if i.kind.value != "user"}
    for run_id in started:
        if run_id in ended:
            continue
        record = await gw.runs.record(run_id)
        if record is not None and record.get("status") in TERMINAL:
            await _write_ending(gw, session_id, record)


async def _write_ending(gw: GatewayState, session_id: str, record: dict[str, Any]) -> None:
    """The run's tool calls and results (`tool_items`), then its ending, in one write."""
    output = record.get("output")
    blocks = content_blocks_from_json(_json_bytes(output)) if output else []
    tools = await tool_items(gw.rt, record)
    await gw.session_store().append(
        session_id, *tools, ending_item(record, blocks), unless_run_ended=str(record["run_id"])
    )


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


@router.get(
    "/{session_id}", response_model=SessionOut, summary="metadata, transcript (seed 002 items), memory keys"
)
async def get_session(gw: Gw, session_id: SessionPath) -> SessionOut:
    store = gw.session_store()
    meta = await _meta(store, session_id)
    await reconcile(gw, session_id)
    items = await store.transcript(session_id)
    children = [s["session_id"] for s in await store.all() if s.get("parent_id") == session_id]
    runs = [str(i.metadata[RUN_ID_KEY]) for i in items if i.kind.value == "user" and RUN_ID_KEY in i.metadata]
    return SessionOut(
        session=meta,
        transcript=[i.model_dump(mode="json") for i in items],
        memory_keys=await store.memory_keys(session_id),
        children=children,
        runs=runs,
    )


@router.get("/{session_id}/memory/{key}", summary="one memory value")
async def get_memory(gw: Gw, session_id: SessionPath, key: MemoryKey) -> dict[str, Any]:
    store = gw.session_store()
    await _meta(store, session_id)
    try:
        return {"key": key, "value": await store.memory_get(session_id, key)}
    except KeyError:
        raise Problem(404, "MemoryKeyNotFound", f"session {session_id} has no memory {key!r}") from None


@router.put("/{session_id}/memory/{key}", summary="set one memory value (any JSON)")
async def put_memory(
    gw: Gw, session_id: SessionPath, key: MemoryKey, value: Annotated[JsonValue, Body(embed=True)]
) -> dict[str, Any]:
    store = gw.session_store()
    await _meta(store, session_id)
    await store.memory_put(session_id, key, value)
    return {"key": key, "value": value}


@router.delete(
    "/{session_id}/memory/{key}", status_code=204, response_class=Response, summary="forget one value"
)
async def delete_memory(gw: Gw, session_id: SessionPath, key: MemoryKey) -> Response:
    store = gw.session_store()
    await _meta(store, session_id)
    if not await store.memory_delete(session_id, key):
        raise Problem(404, "MemoryKeyNotFound", f"session {session_id} has no memory {key!r}")
    return Response(status_code=204)


@router.post(
    "/{session_id}/run",
    summary="send input to the session's agent and stream the run as SSE",
    response_class=EventSourceResponse,
)
async def run_session(gw: Gw, session_id: SessionPath, body: SessionRunIn) -> EventSourceResponse:
    store = gw.session_store()
    meta = await _meta(store, session_id)
    run_id = str(RunId.new())
    await store.append(session_id, user_item(list(body.input), run_id))
    await gw.rt.start_run(
        AgentId.parse(str(meta["agent_id"])),
        list(body.input),
        budget=body.budget,
        session_id=session_id,
        run_id=run_id,
    )
    gw.spawn(_finish(gw, session_id, run_id))
    root = await gw.runs.record(run_id)
    if root is None:
        raise Problem(503, "Service unavailable", f"run {run_id} was started but cannot be read back")
    return sse_response(gw, root, None)


async def _finish(gw: GatewayState, session_id: str, run_id: str) -> None:
    try:
        await gw.rt.wait_run(run_id, timeout=24 * 3600)
        record = await gw.runs.record(run_id)
        if record is not None:
            await _write_ending(gw, session_id, record)
    except Exception:
        # Reconciliation on the next read of the session writes it instead.
        log.warning("could not record the end of run %s in session %s", run_id, session_id, exc_info=True)
