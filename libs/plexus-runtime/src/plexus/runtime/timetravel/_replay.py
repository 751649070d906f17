"""Replay a recorded run tree against an app's agent code, offline, and report the first divergence per agent.

The root is handled again with its recorded input; every child it spawns is replayed when the handler
spawns it (with the blocks the handler passes now) and the handler gets the child's recorded reply. For
each replayed message the replay compares, in this order, with the recording: the children spawned, the
entries appended to sibling logs (plexus.llm's journal: tool results), the entries the handler recorded in
its own log (tool calls and results), the reply, and the state after it. See docs/timetravel.md.
"""

from __future__ import annotations

import asyncio
import copy
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from plexus.core import AgentId, BaseBlock, KernelError, RunChildCompleted, entry_to_json
from plexus.runtime._agent import Agent
from plexus.runtime._app import App
from plexus.runtime._context import Context
from plexus.runtime.wire._envelope import RunInfo, blocks_from_payload
from plexus.runtime.wire._orchestration import RunRecord, RunStatus
from plexus.runtime.wire._recording import Recording, read_recording
from plexus.runtime.wire._statedelta import apply_delta

from ._backend import STOP_ERRORS, RecordedStop, ReplayBackend
from ._errors import ReplayAppMismatchError, ReplayDivergedError
from ._hooks import ReplayHook, replay_hooks
from ._log import ReplayLog
from ._order import CompletionOrder

__all__ = ["Divergence", "ReplayReport", "assert_replays", "replay", "replay_file"]

_RECORD = msgspec.json.Decoder(RunRecord)
_FIELDS = msgspec.json.Decoder(dict[str, Any])
#: Fields that differ on every write of the same entry (when and under which id it was written).
_VOLATILE = frozenset({"timestamp", "id", "duration_s"})
#: Own-log entries the worker writes around the handler, not the handler itself.
_FRAME = frozenset({"msg.received", "reply", "plexus.committed", "plexus.checkpoint"})


@dataclass(frozen=True)
class Divergence:
    """Where a replayed agent first did something else than the recording: both sides."""

    agent_id: str
    run_id: str
    what: str  # "spawn", "step", "entry", "reply", "state", "error", "send", "model"
    recorded: Any
    replayed: Any

    def __str__(self) -> str:
        return (
            f"{self.agent_id} (run {self.run_id}) diverged at {self.what}:\n"
            f"  recorded: {self.recorded!r}\n  replayed: {self.replayed!r}"
        )


@dataclass
class ReplayReport:
    """The replay's outcome: the first divergence per agent (none: the app replays the recording)."""

    root_run_id: str
    replayed: list[str] = field(default_factory=list)  # run ids, in the order they were replayed
    divergences: dict[str, Divergence] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.divergences


@dataclass
class _Message:
    """One recorded message of an agent in the tree: its own-log batch and its sibling-log entries."""

    run: RunRecord
    entries: list[dict[str, Any]]  # the own-log batch, decoded
    siblings: dict[str, list[tuple[int, int, bytes]]]  # suffix -> (seq, index, raw entry)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _json(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value))


class _Replayer:
    def __init__(self, recording: Recording, app: App) -> None:
        self.recording = recording
        self.app = app
        self.hooks: dict[str, ReplayHook] = {h.log_suffix: h for h in replay_hooks()}
        self.runs = {r.run_id: r for r in (_RECORD.decode(line.record) for line in recording.runs)}
        self.states = {s.agent_id: s for s in recording.states}
        self.agents: dict[str, Agent] = {}
        self.messages: dict[str, _Message] = {}
        self.spawned: dict[str, list[str]] = defaultdict(list)  # parent run -> child runs replayed
        self.orders: dict[str, CompletionOrder] = {}  # parent run -> its children's recorded endings
        root = recording.header.root_run_id
        self.report = ReplayReport(root)
        self._index(recording)

    def _index(self, recording: Recording) -> None:
        by_message: dict[str, _Message] = {}
        batches: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        for line in recording.logs:
            if not line.log:
                batches[(line.agent_id, line.seq)].append(_FIELDS.decode(line.entry))
        for entries in batches.values():
            head = entries[0]
            run = self.runs.get(str(head.get("run_id")))
            if head.get("type") == "msg.received" and run is not None and run.run_id not in self.messages:
                message = _Message(run, entries, defaultdict(list))
                self.messages[run.run_id] = message
                by_message[str(head["message_id"])] = message
        for line in recording.logs:
            if line.log:
                fields = _FIELDS.decode(line.entry)
                found = by_message.get(str(fields.get("message_id")))
                if found is not None:
                    found.siblings[line.log].append((line.seq, line.index, bytes(line.entry)))

    def check_app(self) -> None:
        types = sorted({AgentId.parse(r.agent_id).type for r in self.runs.values()})
        missing = [t for t in types if self.app.get(t) is None]
        if missing:
            raise ReplayAppMismatchError(
                f"the app registers no agent type {', '.join(map(repr, missing))} of the recording "
                f"(it registers {sorted(self.app.types)})",
                missing,
            )
        namespace = self.recording.header.namespace
        if self.app.namespace != namespace:
            raise ReplayAppMismatchError(
                f"the recording is of namespace {namespace!r}, the app of {self.app.namespace!r}", []
            )

    def diverged(self, run: RunRecord, what: str, recorded: object, replayed: object) -> None:
        self.report.divergences.setdefault(
            run.agent_id, Divergence(run.agent_id, run.run_id, what, recorded, replayed)
        )

    async def run(self) -> ReplayReport:
        self.check_app()
        root = self.runs.get(self.recording.header.root_run_id)
        if root is None:
            raise ReplayAppMismatchError("the recording holds no record of its root run", [])
        if not self.recording.inputs:
            raise ReplayAppMismatchError("the recording holds no input of its root run", [])
        blocks = blocks_from_payload(self.recording.inputs[0].blocks)
        await self.replay_run(root, blocks)
        return self.report

    async def _agent(self, agent_id: AgentId) -> tuple[Agent, dict[str, Any]]:
        name = str(agent_id)
        state_line = self.states.get(name)
        if name in self.agents:
            agent = self.agents[name]
            return agent, copy.deepcopy(dict(agent.save_state()))
        agent_type = self.app.get(agent_id.type)
        assert agent_type is not None  # check_app
        agent = await agent_type.create(agent_id)
        state: dict[str, Any] = {}
        if state_line is not None and state_line.state is not None:
            state = copy.deepcopy(state_line.state)
        elif state_line is not None:
            self.report.notes.append(f"{name}: its state before the tree is not in the log; started empty")
        agent.load_state(copy.deepcopy(state))
        for hook in self.hooks.values():
            hook.prepare(agent)
        await agent.on_activate(agent_id)
        self.agents[name] = agent
        return agent, state

    async def replay_run(self, run: RunRecord, blocks: Sequence[BaseBlock]) -> None:
        message = self.messages.get(run.run_id)
        if message is None:
            self.report.notes.append(f"run {run.run_id} ({run.agent_id}): no handled message recorded")
            return
        self.report.replayed.append(run.run_id)
        agent_id = AgentId.parse(run.agent_id)
        agent, before = await self._agent(agent_id)
        head = message.entries[0]
        logs: dict[AgentId, ReplayLog] = {}
        for suffix, recorded in message.siblings.items():
            hook = self.hooks.get(suffix)
            rows = [
                (seq, index, raw, hook is not None and hook.shown(_FIELDS.decode(raw)))
                for seq, index, raw in recorded
            ]
            logs[AgentId(agent_id.type + suffix, agent_id.key, agent_id.namespace)] = ReplayLog(rows)
        for hook in self.hooks.values():
            logs.setdefault(
                AgentId(agent_id.type + hook.log_suffix, agent_id.key, agent_id.namespace), ReplayLog([])
            )

        async def spawn_child(
            ctx: Context, child: AgentId, child_blocks: Sequence[BaseBlock]
        ) -> list[BaseBlock]:
            return await self._spawn(ctx, run, child, child_blocks)

        def diverged(what: str, recorded: object, replayed: object) -> None:
            self.diverged(run, what, recorded, replayed)

        backend = ReplayBackend(agent, before, logs, spawn_child, diverged, _recorded_stop(run))
        sender = head.get("sender")
        ctx = Context(
            agent_id=agent_id,
            message_id=str(head["message_id"]),
            sender=AgentId.parse(sender) if isinstance(sender, str) else None,
            topic=None,
            run=RunInfo(
                run_id=run.run_id,
                root_id=run.root_id,
                parent_id=run.parent_id,
                depth=run.depth,
                orchestrated=True,
            ),
            is_rpc=True,
            attempt=1,
            _backend=backend,
        )
        try:
            reply = await agent.on_message(list(blocks), ctx)
        except ReplayDivergedError:
            return  # reported where it was raised
        except KernelError as exc:
            if run.status is RunStatus.COMPLETED:
                self.diverged(run, "error", "completed", f"{exc.error_type}: {exc}")
            return
        self._compare(run, message, logs, ctx, agent, before, reply)

    async def _spawn(
        self, ctx: Context, parent: RunRecord, child: AgentId, blocks: Sequence[BaseBlock]
    ) -> list[BaseBlock]:
        taken = self.spawned[parent.run_id]
        candidates = [c for c in parent.children if c not in taken and self.runs[c].agent_id == str(child)]
        if not candidates:
            left = [self.runs[c].agent_id for c in parent.children if c not in taken]
            self.diverged(parent, "spawn", left, str(child))
            raise ReplayDivergedError(f"{parent.agent_id} spawned {child}, which the recording does not hold")
        record = self.runs[candidates[0]]
        taken.append(record.run_id)
        order = self._order_of(parent)
        order.started(record.run_id)
        try:
            await self.replay_run(record, blocks)
        except BaseException:
            await order.abandon(record.run_id)
            raise
        status = record.status.value if record.status.value in ("completed", "cancelled") else "failed"
        # As the worker records it when the child's reply arrives: the recorded ending, replayed, in the
        # order the recording holds the endings of children that ran at once.
        async with order.turn(record.run_id):
            ctx.record(
                RunChildCompleted(
                    run_id=parent.run_id,
                    agent_id=parent.agent_id,
                    child_run_id=record.run_id,
                    child_agent_id=record.agent_id,
                    status=status,
                )
            )
        if record.status is not RunStatus.COMPLETED:
            raise KernelError.from_wire(
                record.error or {"error_type": "KernelError", "message": record.reason or ""}
            )
        return blocks_from_payload(record.output) if record.output is not None else []

    def _order_of(self, parent: RunRecord) -> CompletionOrder:
        found = self.orders.get(parent.run_id)
        if found is None:
            message = self.messages.get(parent.run_id)
            endings = [
                str(e.get("child_run_id"))
                for e in (message.entries if message is not None else [])
                if e.get("type") == "child.completed"
            ]
            found = self.orders[parent.run_id] = CompletionOrder(endings)
        return found

    def _compare(
        self,
        run: RunRecord,
        message: _Message,
        logs: dict[AgentId, ReplayLog],
        ctx: Context,
        agent: Agent,
        before: dict[str, Any],
        reply: list[BaseBlock] | None,
    ) -> None:
        agent_id = AgentId.parse(run.agent_id)
        for suffix, recorded in message.siblings.items():
            hook = self.hooks.get(suffix)
            own = [_FIELDS.decode(raw) for _, _, raw in recorded]
            expected = [_strip(e) for e in own if hook is None or not hook.shown(e)]
            log = logs[AgentId(agent_id.type + suffix, agent_id.key, agent_id.namespace)]
            made = [_strip(_FIELDS.decode(entry_to_json(e))) for e in log.appended]
            if not _first_difference(run, f"{suffix} entry", expected, made, self.diverged):
                return
        ignored = set(_FRAME).union(*(h.own_entry_types for h in self.hooks.values()))
        expected = [_strip(e) for e in message.entries if e.get("type") not in ignored]
        made = [_strip(_FIELDS.decode(entry_to_json(e))) for e in ctx.pending_entries]
        made = [e for e in made if e.get("type") not in ignored]
        if not _first_difference(run, "entry", expected, made, self.diverged):
            return
        recorded_children = [self.runs[c].agent_id for c in run.children]
        replayed_children = [self.runs[c].agent_id for c in self.spawned[run.run_id]]
        if sorted(recorded_children) != sorted(replayed_children):
            self.diverged(run, "spawn", recorded_children, replayed_children)
            return
        replayed_reply = _json([b.model_dump(mode="json") for b in reply or []])
        recorded_reply = (
            _FIELDS.decode(b'{"r":' + bytes(run.output) + b"}")["r"] if run.output is not None else []
        )
        if run.status is RunStatus.COMPLETED and _strip(replayed_reply) != _strip(recorded_reply):
            self.diverged(run, "reply", recorded_reply, replayed_reply)
            return
        after = _recorded_state(before, message.entries)
        if after is not None:
            state = _json(dict(agent.save_state()))
            if state != _json(after):
                keys = sorted(k for k in set(state) | set(after) if state.get(k) != _json(after).get(k))
                self.diverged(
                    run, f"state {keys}", {k: after.get(k) for k in keys}, {k: state.get(k) for k in keys}
                )


def _recorded_stop(run: RunRecord) -> RecordedStop | None:
    error = run.error
    if run.status is RunStatus.COMPLETED or error is None or error.get("error_type") not in STOP_ERRORS:
        return None
    return RecordedStop(error, run.own_usage.tokens, run.own_usage.turns)


def _first_difference(run: RunRecord, what: str, expected: list[Any], made: list[Any], report: Any) -> bool:
    for number, (want, got) in enumerate(zip(expected, made, strict=False)):
        if want != got:
            report(run, f"{what} {number}", want, got)
            return False
    if len(expected) != len(made):
        cut = min(len(expected), len(made))
        report(run, f"{what} {cut}", expected[cut : cut + 1] or None, made[cut : cut + 1] or None)
        return False
    return True


def _recorded_state(before: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The state after the message as the log says (None: a checkpoint holds it, not the log)."""
    for entry in entries:
        if entry.get("type") == "plexus.committed":
            state = copy.deepcopy(before)
            if entry.get("state") is not None:
                apply_delta(state, entry["state"])
            return state
    return None


async def replay(recording: Recording, app: App) -> ReplayReport:
    """Replay ``recording`` against ``app``'s agent code, offline (no NATS, no model provider)."""
    return await _Replayer(recording, app).run()


async def replay_file(path: str | Path, app: App) -> ReplayReport:
    data = await asyncio.to_thread(Path(path).read_bytes)
    recording = read_recording(data.splitlines())
    return await replay(recording, app)


async def assert_replays(path: str | Path | Recording, app: App) -> ReplayReport:
    """For tests: replay a recording (a file or a `Recording`) and fail with every divergence found."""
    report = await (replay(path, app) if isinstance(path, Recording) else replay_file(path, app))
    if not report.ok:
        raise AssertionError(
            "the app does not replay the recording:\n" + "\n".join(map(str, report.divergences.values()))
        )
    return report
