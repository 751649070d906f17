"""An LLM agent's transcript in one run, for ``GET /v1/runs/{id}/transcript`` and the dashboard's view of it.

Read from what is stored, never from a worker: the loop's journal (``<type>.llm-journal/<key>``,
docs/llm.md: every model turn and tool step as it completes, so the view is live) and the agent's EventLog
(its handled messages, and the records committed with each: ``llm.call``, a model call's model and
latency; ``llm.retry``, a failed attempt of it that was retried; ``llm.approval``, a decision the agent took:
the call, the verdict and who decided). The gateway does not import plexus.llm: entries are read as the
JSON they are stored as.
"""

from __future__ import annotations

from typing import Any

import msgspec

from plexus.core import AgentId, entry_to_json
from plexus.runtime import Runtime
from plexus.runtime.kernel import escape_token
from plexus.runtime.orchestration import input_key

__all__ = ["JOURNAL_SUFFIX", "agent_transcript"]

#: The journal's type suffix (docs/llm.md, "The journal").
JOURNAL_SUFFIX = ".llm-journal"

_decode = msgspec.json.Decoder(dict[str, Any]).decode


async def _entries(rt: Runtime, agent: AgentId) -> list[tuple[int, dict[str, Any]]]:
    return [(r.seq, _decode(entry_to_json(r.entry))) for r in await rt.event_log(agent).read()]


async def agent_transcript(rt: Runtime, record: dict[str, Any], agent: AgentId) -> dict[str, Any]:
    """The agent's turns in the run of ``record``, grouped by handled message, oldest first."""
    journal_id = AgentId(agent.type + JOURNAL_SUFFIX, agent.key, agent.namespace)
    journal = await _entries(rt, journal_id)
    log = await _entries(rt, agent)
    run_id = record["run_id"]
    # The agent's messages in this run (committed ones), and the model calls each committed.
    in_run: dict[str, list[dict[str, Any]]] = {}
    decisions: dict[str, list[dict[str, Any]]] = {}
    batches: dict[int, list[dict[str, Any]]] = {}
    for seq, entry in log:
        batches.setdefault(seq, []).append(entry)
    order: list[str] = []
    for entries in batches.values():
        received = next((e for e in entries if e.get("type") == "msg.received"), None)
        if received is None or received.get("run_id") != run_id:
            continue
        order.append(received["message_id"])
        in_run[received["message_id"]] = _calls(entries)
        decisions[received["message_id"]] = [_decision(e) for e in entries if e.get("type") == "llm.approval"]
    steps: dict[str, dict[int, dict[str, Any]]] = {}
    for _seq, entry in journal:
        if entry.get("type") == "llm.step":
            steps.setdefault(entry["message_id"], {})[entry["step"]] = entry
    live = record.get("status") not in ("completed", "failed", "cancelled", "guardrail_tripped")
    # A message still being handled is in the journal but not yet in the log: the run's latest.
    pending = [m for m in steps if m not in in_run]
    if live and pending:
        order.append(pending[-1])
    messages = [
        _message(m, steps.get(m, {}), in_run.get(m), index) | {"approvals": decisions.get(m, [])}
        for index, m in enumerate(order)
    ]
    stored = await rt.connection.gets.kv_entry(
        rt.connection.topology.names.runs_bucket, input_key(escape_token(run_id))
    )
    return {
        "run_id": run_id,
        "agent_id": str(agent),
        "status": record.get("status", "pending"),
        "live": live,
        "attempts": record.get("attempts", 0),
        "error": record.get("error"),
        "awaiting": record.get("awaiting", []),
        "decided": record.get("decided", []),
        "forked_from": record.get("forked_from"),
        "input": msgspec.json.decode(stored.data) if stored is not None and stored.data else None,
        "messages": messages,
    }


def _message(
    message_id: str, steps: dict[int, dict[str, Any]], calls: list[dict[str, Any]] | None, index: int
) -> dict[str, Any]:
    ordered = [steps[n] for n in sorted(steps)]
    turns: list[dict[str, Any]] = []
    for step in ordered:
        if step.get("finish_reason") is not None:
            turns.append(
                {
                    "turn": len(turns) + 1,
                    "step": step["step"],
                    "at": step.get("timestamp"),
                    "item": step["item"],
                    "usage": step.get("usage"),
                    "finish_reason": step.get("finish_reason"),
                    "model": None,
                    "latency_s": None,
                    "tools": None,
                    "retries": [],
                }
            )
        elif turns:
            turns[-1]["tools"] = step["item"]
    # The calls the committed handling made are its last turns (turns a crashed handling journaled were
    # replayed, not called again), so they are matched from the end.
    for turn, call in zip(reversed(turns), reversed(calls or []), strict=False):
        turn["model"] = call.get("model")
        turn["latency_s"] = call.get("duration_s")
        turn["retries"] = call["retries"]
    return {"message_id": message_id, "index": index, "committed": calls is not None, "turns": turns}


def _decision(entry: dict[str, Any]) -> dict[str, Any]:
    """A decision the agent took with a message: the call, the verdict, why, and who decided."""
    return {
        "call_id": entry.get("call_id"),
        "approved": entry.get("approved") is True,
        "reason": entry.get("reason") or "",
        "decided_by": entry.get("decided_by"),
        "at": entry.get("timestamp"),
    }


def _calls(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model calls a message committed (``llm.call``), each with the provider retries (``llm.retry``,
    logged before it) of its failed attempts."""
    calls: list[dict[str, Any]] = []
    retries: list[dict[str, Any]] = []
    for entry in entries:
        if entry.get("type") == "llm.retry":
            retries.append({k: entry.get(k) for k in ("attempt", "error_type", "message", "wait_s")})
        elif entry.get("type") == "llm.call":
            calls.append({**entry, "retries": retries})
            retries = []
    return calls
