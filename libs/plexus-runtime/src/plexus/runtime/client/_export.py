"""`Runtime.export_run`: one run tree as a `Recording` (docs/timetravel.md).

What is read, all without the orchestrator: the tree's run records and the root's input from the runs
bucket; every agent's own EventLog, of which the batches of the tree's messages are kept (a committed
message's batch starts with its ``msg.received`` entry, naming the run) and the ones before are folded into
the agent's state at the tree's start; the agent's sibling logs (``<type>.<suffix>``, e.g. plexus.llm's
journal), of which the entries naming one of the tree's messages (``message_id``) are kept; the tree's
progress events. Nothing is written.
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import nats.errors

from plexus.core import AgentId, entry_to_json
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._eventlog import LogRecord
from plexus.runtime.wire._orchestration import TERMINAL, RunNotFoundError, RunRecord, input_key, run_key
from plexus.runtime.wire._recording import (
    InputLine,
    LogLine,
    ProgressLine,
    Recording,
    RecordingError,
    RecordingHeader,
    RunLine,
    StateLine,
)
from plexus.runtime.wire._statedelta import apply_delta
from plexus.runtime.wire._subjects import escape_token, unescape_token

__all__ = ["RunNotEndedError", "export_run"]

_RECORD = msgspec.json.Decoder(RunRecord)
_FIELDS = msgspec.json.Decoder(dict[str, Any])


class RunNotEndedError(RecordingError):
    """The run tree has not ended: an export would miss its later steps (``partial=True``: marked partial)."""

    fields = ("message", "run_id", "status")

    def __init__(self, message: str = "", run_id: str = "", status: str = "") -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status


async def export_run(conn: Connection, run_id: str, *, partial: bool = False) -> Recording:
    """The whole tree of ``run_id`` (any run of it: the tree of its root is exported)."""
    bucket = conn.topology.names.runs_bucket
    first = await _record(conn, bucket, run_id)
    root = first if first.root_id == first.run_id else await _record(conn, bucket, first.root_id)
    records = [root]
    queue = list(root.children)
    while queue:
        child = await _record(conn, bucket, queue.pop(0))
        records.append(child)
        queue.extend(child.children)
    running = [r for r in records if r.status not in TERMINAL]
    if running and not partial:
        raise RunNotEndedError(
            f"run {running[0].run_id} of tree {root.run_id} is {running[0].status.value}: "
            "export it when the tree has ended, or as partial",
            running[0].run_id,
            running[0].status.value,
        )
    namespace = AgentId.parse(root.agent_id).namespace
    out = Recording(RecordingHeader(namespace=namespace, root_run_id=root.run_id, partial=bool(running)))
    encode = msgspec.json.encode
    out.runs = [RunLine(record=msgspec.Raw(encode(r))) for r in records]
    stored = await conn.gets.kv_entry(bucket, input_key(escape_token(root.run_id)))
    if stored is not None and stored.data:
        out.inputs.append(InputLine(run_id=root.run_id, blocks=msgspec.Raw(stored.data)))
    tree = {r.run_id for r in records}
    agents = list(dict.fromkeys(r.agent_id for r in records))
    message_ids: set[str] = set()
    for agent in agents:
        message_ids |= await _own_log(conn, AgentId.parse(agent), tree, out)
    for agent in agents:
        await _sibling_logs(conn, AgentId.parse(agent), message_ids, out)
    out.progress = await _progress(conn, namespace, root.run_id)
    return out


async def _record(conn: Connection, bucket: str, run_id: str) -> RunRecord:
    stored = await conn.gets.kv_entry(bucket, run_key(escape_token(run_id)))
    if stored is None or not stored.data:
        raise RunNotFoundError(run_id)
    return _RECORD.decode(stored.data)


def _batches(records: list[LogRecord[Any]]) -> list[list[LogRecord[Any]]]:
    batches: list[list[LogRecord[Any]]] = []
    for record in records:
        if batches and batches[-1][0].seq == record.seq:
            batches[-1].append(record)
        else:
            batches.append([record])
    return batches


async def _own_log(conn: Connection, agent: AgentId, tree: set[str], out: Recording) -> set[str]:
    """Keep the tree's batches of ``agent``'s log; fold the ones before into its state at the tree's start."""
    state: dict[str, Any] | None = {}
    started = False
    messages: set[str] = set()
    for batch in _batches(await conn.event_log(agent).read()):
        head = batch[0].entry
        if getattr(head, "run_id", None) in tree:  # a message of the tree, or a child spawned by one
            if not started:
                out.states.append(StateLine(agent_id=str(agent), state=state, known=state is not None))
                started = True
            if getattr(head, "type", None) == "msg.received":
                messages.add(str(head.message_id))
            out.logs.extend(
                LogLine(
                    agent_id=str(agent), seq=r.seq, index=r.index, entry=msgspec.Raw(entry_to_json(r.entry))
                )
                for r in batch
            )
        elif not started and state is not None:
            state = _fold(state, batch)
    return messages


def _fold(state: dict[str, Any], batch: list[LogRecord[Any]]) -> dict[str, Any] | None:
    """The state after a batch: its marker's delta applied; None (unknown) for a checkpointed message."""
    if getattr(batch[0].entry, "type", None) != "msg.received":
        return state  # not a message (e.g. a checkpoint notice): the state did not change by it
    for record in batch:
        if getattr(record.entry, "type", None) == "plexus.committed":
            delta = getattr(record.entry, "state", None)
            if delta is not None:
                apply_delta(state, delta)
            return state
    return None  # committed by a checkpoint, which holds only the latest state


async def _sibling_logs(conn: Connection, agent: AgentId, message_ids: set[str], out: Recording) -> None:
    subjects = conn.subjects_for(agent.namespace)
    own = subjects.evlog(agent.type, agent.key)
    pattern = own.rsplit(".", 2)[0] + ".*." + own.rsplit(".", 1)[1]
    info = await conn.js.stream_info(conn.topology.names.events_stream, subjects_filter=pattern)
    found = info.state.subjects or {}
    prefix = agent.type + "."
    for subject in sorted(found):
        kind = unescape_token(subject.rsplit(".", 2)[1])
        if not kind.startswith(prefix):
            continue
        sibling = AgentId(kind, agent.key, agent.namespace)
        for r in await conn.event_log(sibling).read():
            if getattr(r.entry, "message_id", None) in message_ids:
                out.logs.append(
                    LogLine(
                        agent_id=str(agent),
                        log=kind[len(agent.type) :],
                        seq=r.seq,
                        index=r.index,
                        entry=msgspec.Raw(entry_to_json(r.entry)),
                    )
                )


async def _progress(conn: Connection, namespace: str, root_id: str) -> list[ProgressLine]:
    """The tree's progress events still kept by the progress stream (it keeps them for a limited age)."""
    lines: list[ProgressLine] = []
    sub = await conn.js.subscribe(
        conn.subjects_for(namespace).progress_tree(root_id),
        ordered_consumer=True,
        stream=conn.topology.names.progress_stream,
    )
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                break
            lines.append(ProgressLine(event=msgspec.Raw(msg.data)))
            if msg.metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return lines
