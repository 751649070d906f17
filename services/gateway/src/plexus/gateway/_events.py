"""The SSE stream of one run tree: a snapshot, then every progress event of the tree, then ``[DONE]``.

Every event has its own ``id`` (`EventIds`): a durable event's is the JetStream sequence of the progress
message it carries (the snapshot's is 0), ``<seq>.<n>`` is the n-th event sent after durable event ``seq``
that is not durable itself (a token delta, a reconciled status, ``[DONE]``). A reconnect with
``Last-Event-ID: <seq>[.<n>]`` resumes at sequence seq+1 of the same durable stream: nothing lost, nothing
repeated, whichever gateway replica answers (tokens and reconciled statuses are not replayed).

Events of the orchestrator (``orchestrator/<run>``) are run status changes (``status``); an agent's own
steps are ``progress``, its tool calls ``tool_call``. Each event carries the tree's usage totals so budget
gauges move as tokens are spent.

``[DONE]`` comes once the root has ended, every run of the tree has ended, and the orchestrator's ``status``
event of each of those endings is on the stream and was sent: the orchestrator writes a run's record first
and announces the change after, so a record that reads "ended" does not mean its event is stored yet, and a
``[DONE]`` before it would leave the stream one event short of what a resume reads. An ending announced
nowhere (its orchestrator replica died in between) holds ``[DONE]`` back for at most ``settle_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from nats.js import api as js_api

from plexus.runtime import Runtime

from ._feed import TreeFeed
from ._runs import TERMINAL, RunsView, budget_view
from ._tokens import TokenTap

__all__ = [
    "EVENT_ID_PATTERN",
    "ORCHESTRATOR_PREFIX",
    "ORCHESTRATOR_TYPE",
    "EventIds",
    "event_name",
    "parse_event_id",
    "tree_events",
]

#: The agent type of the orchestrator's progress events (``orchestrator/<run>``: one key per run).
ORCHESTRATOR_TYPE = "orchestrator"
ORCHESTRATOR_PREFIX = f"{ORCHESTRATOR_TYPE}/"


def event_name(progress: dict[str, Any]) -> str:
    if str(progress.get("agent_id", "")).startswith(ORCHESTRATOR_PREFIX):
        return "status"
    step = progress.get("step")
    if step in ("tool_call", "tool_result"):
        return "tool_call"
    return "progress"


#: ``<seq>`` or ``<seq>.<n>``, decimal without leading zeros (what `EventIds` sends, and all a resume takes).
EVENT_ID_PATTERN = r"^(0|[1-9][0-9]{0,18})(\.[1-9][0-9]{0,9})?$"
_EVENT_ID = re.compile(EVENT_ID_PATTERN)


def parse_event_id(text: str) -> tuple[int, int]:
    """``(seq, n)`` of an event id (n is 0 for a durable event); ValueError if it is not one."""
    match = _EVENT_ID.fullmatch(text)
    if match is None:
        raise ValueError(f"{text[:40]!r} is not an event id (<seq> or <seq>.<n>)")
    return int(match[1]), int(match[2][1:]) if match[2] else 0


class EventIds:
    """The ids of one stream: unique, and each one a resume point (see the module docstring)."""

    def __init__(self, seq: int = 0, n: int = 0) -> None:
        #: The sequence of the last durable event sent (or resumed after).
        self.seq = seq
        self._n = n

    def durable(self, seq: int) -> str:
        self.seq, self._n = seq, 0
        return str(seq)

    def transient(self) -> str:
        self._n += 1
        return f"{self.seq}.{self._n}"


def _sse(event_id: str, name: str, data: Any) -> dict[str, str]:
    return {"id": event_id, "event": name, "data": json.dumps(data, separators=(",", ":"))}


async def tree_events(
    rt: Runtime,
    root: dict[str, Any],
    last_event_id: tuple[int, int] | None,
    poll_s: float = 0.5,
    settle_s: float = 10.0,
) -> AsyncIterator[dict[str, str]]:
    """Yield sse-starlette event dicts for the tree rooted at ``root`` until the root has ended; resume after
    ``last_event_id`` (`parse_event_id`) if given."""
    view = RunsView(rt)
    root_id = str(root["run_id"])
    subject = rt.subjects.progress_tree(root_id)
    stream = rt.topology.names.progress_stream
    seen_at_start: dict[str, tuple[Any, Any]] = {}
    runs_at_start: list[dict[str, Any]] = []
    usage: dict[str, int] = {}
    if last_event_id is None:
        runs = runs_at_start = await view.tree(root)
        usage = await view.usage(root)
        seen_at_start = {str(r["run_id"]): (r.get("status"), r.get("updated_at")) for r in runs}
        yield _sse(
            "0",
            "snapshot",
            {"root_id": root_id, "runs": runs, "usage": usage, "budget": budget_view(root, usage)},
        )
        config = js_api.ConsumerConfig(deliver_policy=js_api.DeliverPolicy.ALL)
    else:
        config = js_api.ConsumerConfig(
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=last_event_id[0] + 1
        )
    ids = EventIds(*(last_event_id or (0, 0)))
    # run_id -> (status, updated_at) last shown to this client
    seen: dict[str, tuple[Any, Any]] = seen_at_start if last_event_id is None else {}
    # Runs whose ending's status event is on the stream (read here, or found there before a resume point).
    announced: set[str] = set()
    feed = TreeFeed()
    sub = await rt.js.subscribe(subject, ordered_consumer=True, stream=stream, config=config, cb=feed.deliver)
    tap = TokenTap(rt, wake=feed.wake)
    # Re-read the usage counters only after one of them moved (three JetStream reads per event otherwise).
    usage_moved = asyncio.Event()
    usage_moved.set()

    async def on_increment(_msg: Any) -> None:
        usage_moved.set()

    counters = await rt.nc.subscribe(view.counters_subject(root), cb=on_increment)
    for known in runs_at_start:
        await tap.watch(str(known.get("agent_id", "")), str(known["run_id"]))
    # The quiet poll's clock: restarted by each durable event and each poll, not by token deltas.
    idle_from = time.monotonic()
    # When the root's record was last read: between its status events it is read again at most every
    # `poll_s` (an ending never announced still shows), not after every event of a busy tree.
    root_read_at = float("-inf")
    try:
        pending = await _pending(rt, sub, feed)
        while True:
            if pending == 0 and time.monotonic() - root_read_at >= poll_s:
                root = await view.record(root_id) or root
                root_read_at = time.monotonic()
            if pending == 0:
                if root.get("status") in TERMINAL and feed.msgs:
                    pending = 1  # the root ended but events of the tree are still on their way to us
                elif root.get("status") in TERMINAL:
                    runs = await view.tree(root)
                    # Looked up before `_pending` is asked: an ending stored by then is counted there.
                    unannounced = await _unannounced(rt, stream, root_id, runs, announced)
                    if await _pending(rt, sub, feed) > 0:
                        pending = 1
                    else:
                        # Children end just after their root (a cancel reaches them last): show their ends
                        # too, waiting at most `settle_s` for a child that never reports (its worker died)
                        # or an ending whose status event never comes.
                        async for event in _reconcile(view, root, runs, seen, ids, tap):
                            yield event
                        settled = not unannounced and all(status in TERMINAL for status, _ in seen.values())
                        if settled or time.time() - float(root.get("updated_at") or 0.0) > settle_s:
                            yield {"id": ids.transient(), "data": "[DONE]"}
                            return
            nothing = not feed.msgs and tap.queue.empty()
            if nothing and not await feed.wait(poll_s - (time.monotonic() - idle_from)):
                # Quiet for a while: compare the tree's records with what this client was shown, so a change
                # that was never announced (the orchestrator's announcements are best effort) still shows.
                idle_from = time.monotonic()
                pending = await _pending(rt, sub, feed)
                async for event in _reconcile(view, root, await view.tree(root), seen, ids, tap):
                    yield event
                continue
            if not tap.queue.empty():
                # Not durable: not replayed on resume.
                yield _sse(ids.transient(), "token", tap.queue.get_nowait())
                continue
            if not feed.msgs:
                continue
            msg = feed.take()
            idle_from = time.monotonic()
            meta = msg.metadata
            event_id = ids.durable(meta.sequence.stream)
            pending = meta.num_pending
            try:
                progress = json.loads(msg.data)
            except ValueError:
                continue  # not ours to show; the id still advances with the next event
            if not isinstance(progress, dict):
                continue
            name = event_name(progress)
            data: dict[str, Any] = {"progress": progress}
            run_id = str(progress.get("run_id", ""))
            if name == "status" and _announces_ending(progress):
                announced.add(run_id)
            # A run's record goes with its status changes and with the first event of a run this client has
            # not seen yet (a child announces itself by acting before any status of its own is shown).
            if name == "status" or run_id not in seen:
                record = await view.record(run_id)
                if record is not None:
                    data["run"] = record
                    seen[run_id] = (record.get("status"), record.get("updated_at"))
                    await tap.watch(str(record.get("agent_id", "")), run_id)
                if run_id == root_id and record is not None:
                    root = record
                    root_read_at = time.monotonic()
            if usage_moved.is_set() or name == "status":
                usage_moved.clear()
                usage = await view.usage(root)
            data["usage"] = usage
            data["budget"] = budget_view(root, usage)
            yield _sse(event_id, name, data)
    finally:
        await tap.close()
        with contextlib.suppress(Exception):
            await counters.unsubscribe()
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _reconcile(
    view: RunsView,
    root: dict[str, Any],
    runs: list[dict[str, Any]],
    seen: dict[str, tuple[Any, Any]],
    ids: EventIds,
    tap: TokenTap,
) -> AsyncIterator[dict[str, str]]:
    """``status`` events (not durable: state as of the last durable event) for the runs of ``runs`` (the
    tree's records) whose record changed since this client last saw it."""
    changed = [r for r in runs if seen.get(str(r["run_id"])) != (r.get("status"), r.get("updated_at"))]
    if not changed:
        return
    usage = await view.usage(root)
    for record in changed:
        seen[str(record["run_id"])] = (record.get("status"), record.get("updated_at"))
        await tap.watch(str(record.get("agent_id", "")), str(record["run_id"]))
        yield _sse(
            ids.transient(),
            "status",
            {"run": record, "reconciled": True, "usage": usage, "budget": budget_view(root, usage)},
        )


def _announces_ending(progress: dict[str, Any]) -> bool:
    """Whether an orchestrator ``status`` event is the announcement of its run's ending."""
    metadata = progress.get("metadata")
    return isinstance(metadata, dict) and metadata.get("status") in TERMINAL


async def _unannounced(
    rt: Runtime, stream: str, root_id: str, runs: list[dict[str, Any]], announced: set[str]
) -> list[str]:
    """The ended runs of ``runs`` whose ending's status event is not on the stream yet.

    Runs not in ``announced`` (a resumed stream started after their event, or it is still on its way) are
    looked up on the stream: the last event of the run's orchestrator subject is its ending once stored."""
    ended = [str(r["run_id"]) for r in runs if r.get("status") in TERMINAL]
    unknown = [run_id for run_id in ended if run_id not in announced]
    found = await asyncio.gather(*(_ending_stored(rt, stream, root_id, run_id) for run_id in unknown))
    announced.update(run_id for run_id, stored in zip(unknown, found, strict=True) if stored)
    return [run_id for run_id in ended if run_id not in announced]


async def _ending_stored(rt: Runtime, stream: str, root_id: str, run_id: str) -> bool:
    subject = rt.subjects.progress(root_id, ORCHESTRATOR_TYPE, run_id)
    try:
        msg = await rt.js.get_last_msg(stream, subject)
        progress = json.loads(msg.data or b"")
    except Exception:
        return False  # not stored yet, or cannot tell now: asked again next round (`settle_s` bounds it)
    return isinstance(progress, dict) and _announces_ending(progress)


async def _pending(rt: Runtime, sub: Any, feed: TreeFeed) -> int:
    """Messages of the tree not yet sent: still on the server, or received and queued here.

    A quiet poll proves nothing on a busy gateway, so before ``[DONE]`` we ask. The flush
    makes every message the server sent before it arrive first (one TCP stream), so none is in flight.
    """
    try:
        await rt.nc.flush(timeout=5)
        info = await sub.consumer_info()
    except Exception:
        return 1  # cannot tell: keep reading (a timeout brings us back here)
    return int(info.num_pending or 0) + int(sub.pending_msgs) + len(feed.msgs)
