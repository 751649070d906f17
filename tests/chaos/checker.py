"""The invariant checker of a chaos run: reads what happened and reports violations (each must be 0).

- lost: an answered (so accepted) message missing from its agent's committed state;
- duplicates / order: a number twice in the state, or out of order (per-key FIFO);
- EventLog duplicates: one message id received twice in an agent's EventLog;
- re-executions after commit: a handler execution of a message that started after the caller had its
  answer (it should have been answered from the checkpoint); re-executions before the commit (a crash
  between start and commit) are counted, not violations;
- overlapping activations: two completed executions of one key on different processes overlapping in time,
  except a zombie's tail: a handler frozen mid-body (SIGSTOP) finishes its last instructions when resumed,
  before it can learn that its lease is gone; its effects are fenced (the state checks above prove it), so
  such overlaps are counted apart (`zombie_tails`), not as violations; so is a handler whose first line runs
  within `_RESUME_GRACE_S` of its process being resumed (the worker looks at its lease right before a handler
  begins, so only a freeze inside that last synchronous step leaves one), also when it re-ran a message;
- stuck runs: a run tree not ended after the load stopped; budget overshoot: a tree's tokens beyond its
  budget plus the increments that could be in flight (one per leaf);
- recovery: per fault, the time until every key was answered again.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plexus.core import AgentId, KernelError, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.orchestration import TERMINAL

if TYPE_CHECKING:
    from .faults import Fault
    from .harness import Load


@dataclass
class Report:
    seed: int
    duration_s: float
    messages_answered: int = 0
    sends: int = 0
    runs_started: int = 0
    runs_by_status: dict[str, int] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    re_executions_before_commit: int = 0
    zombie_tails: int = 0
    unanswered: int = 0
    client_errors: dict[str, int] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def summary(self) -> str:
        rec = {k: f"max {max(v):.1f}s over {len(v)}" for k, v in sorted(self.recovery_s.items()) if v}
        return (
            f"chaos seed {self.seed}: {self.messages_answered} messages answered ({self.sends} sends), "
            f"{self.runs_started} run trees {self.runs_by_status}, {len(self.faults)} faults; "
            f"violations {self.violations}; re-executions before commit {self.re_executions_before_commit}, "
            f"zombie tails {self.zombie_tails}; "
            f"recovery {rec}; client errors retried {self.client_errors}"
        )

    def _count(self, name: str, n: int, detail: str = "") -> None:
        self.violations[name] = self.violations.get(name, 0) + n
        if n and detail and len(self.details) < 50:
            self.details.append(detail)


async def check(
    client: Runtime,
    admin: Runtime,
    workdir: Path,
    load: Load,
    faults: list[Fault],
    seed: int,
    duration_s: float,
) -> Report:
    report = Report(seed=seed, duration_s=duration_s, sends=load.sends, client_errors=dict(load.errors))
    for name in (
        "lost",
        "duplicates",
        "order",
        "eventlog_duplicates",
        "re_executed_after_commit",
        "overlapping_activations",
        "stuck_runs",
        "budget_overshoot",
    ):
        report.violations[name] = 0
    report.messages_answered = sum(len(a) for a in load.answered.values())
    report.unanswered = sum(len(u) for u in load.unanswered.values())
    executions = _executions(workdir)
    stalls = [(f.pid, f.at, f.healed_at) for f in faults if f.pid]
    for key, answered in sorted(load.answered.items()):
        await _check_key(client, key, answered, executions.get(key, {}), report, stalls)
    await _check_runs(admin, load, report)
    for fault in faults:
        report.faults.append(asdict(fault))
        report.recovery_s.setdefault(fault.kind, []).append(round(_recovery(fault.at, load), 2))
    return report


async def _check_key(
    rt: Runtime,
    key: str,
    answered: dict[int, float],
    runs: dict[int, list[dict[str, Any]]],
    report: Report,
    stalls: list[tuple[int, float, float]],
) -> None:
    agent = AgentId("ledger", key)
    reply = await _patiently(lambda: rt.send_message([TextBlock(text='{"report": true}')], agent, timeout=30))
    seen: list[int] = json.loads("".join(getattr(b, "text", "") for b in reply))
    lost = sorted(set(answered) - set(seen))
    report._count("lost", len(lost), f"{key}: answered but not in state: {lost[:10]}")
    dups = len(seen) - len(set(seen))
    report._count("duplicates", dups, f"{key}: {dups} numbers twice in state")
    disorder = sum(1 for a, b in itertools.pairwise(seen) if b <= a)
    report._count("order", disorder, f"{key}: {disorder} out-of-order steps in {seen[:20]}")

    records = await _patiently(lambda: rt.event_log(agent).read())
    received = [r.entry.message_id for r in records if type(r.entry).__name__ == "RunMessageReceived"]
    dup_ids = len(received) - len(set(received))
    report._count("eventlog_duplicates", dup_ids, f"{key}: {dup_ids} message ids received twice")

    spans: list[tuple[float, float, int]] = []
    for n, lines in runs.items():
        starts = [line for line in lines if line["k"] == "start"]
        report.re_executions_before_commit += max(0, len(starts) - 1)
        if n in answered:
            late = [s for s in starts if s["t"] > answered[n] + 0.001]
            resumed = [s for s in late if _resumed_into((s["t"], s["t"], s["pid"]), stalls)]
            report.zombie_tails += len(resumed)
            report._count(
                "re_executed_after_commit", len(late) - len(resumed), f"{key}#{n}: ran again after its answer"
            )
        ends = {(line["pid"]): line["t"] for line in lines if line["k"] == "end"}
        spans += [(s["t"], ends[s["pid"]], s["pid"]) for s in starts if s["pid"] in ends]
    spans.sort()
    overlaps = [(a, b) for a, b in itertools.pairwise(spans) if b[0] < a[1] and b[2] != a[2]]
    tails = [
        p for p in overlaps if any(_frozen_in(span, stalls) or _resumed_into(span, stalls) for span in p)
    ]
    report.zombie_tails += len(tails)
    real = len(overlaps) - len(tails)
    report._count("overlapping_activations", real, f"{key}: {real} overlapping executions {overlaps[:3]}")


async def _check_runs(admin: Runtime, load: Load, report: Report) -> None:
    report.runs_started = len(load.runs)
    budget_slack = 3 * 10  # one in-flight increment per leaf (see harness: TREE_LEAVES * TREE_TOKENS)
    for run_id, budget in load.runs.items():
        try:
            record = await _patiently(lambda r=run_id: admin.wait_run(r, timeout=60))
        except KernelError:
            report._count("stuck_runs", 1, f"{run_id}: not ended")
            continue
        status = str(record.status)
        report.runs_by_status[status] = report.runs_by_status.get(status, 0) + 1
        if status not in {str(s) for s in TERMINAL}:
            report._count("stuck_runs", 1, f"{run_id}: {status}")
        if budget is not None and record.usage.tokens > budget + budget_slack:
            report._count("budget_overshoot", 1, f"{run_id}: {record.usage.tokens} tokens for {budget}")


def _frozen_in(span: tuple[float, float, int], stalls: list[tuple[int, float, float]]) -> bool:
    """Whether this execution's process was frozen (SIGSTOP) while it ran."""
    start, end, pid = span
    return any(pid == stalled and start <= healed and end >= at for stalled, at, healed in stalls)


#: How soon after a frozen process is resumed its first instructions run: a handler it had already decided
#: to start (its lease fresh then) begins within this, before it can look at its lease again.
_RESUME_GRACE_S = 0.1


def _resumed_into(span: tuple[float, float, int], stalls: list[tuple[int, float, float]]) -> bool:
    """Whether this execution began as its process was resumed (SIGCONT): decided before the freeze."""
    start, _, pid = span
    return any(
        pid == stalled and healed <= start <= healed + _RESUME_GRACE_S for stalled, _, healed in stalls
    )


def _executions(workdir: Path) -> dict[str, dict[int, list[dict[str, Any]]]]:
    out: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for path in workdir.glob("exec-*.log"):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                out[record["key"]][int(record["n"])].append(record)
    return out


def _recovery(at: float, load: Load) -> float:
    """Seconds from the fault until every key that was sending had an answer again."""
    firsts = []
    for answered in load.answered.values():
        after = [t for t in answered.values() if t >= at]
        if after:
            firsts.append(min(after))
    return max(firsts) - at if firsts else float("nan")


async def _patiently(call: Any, attempts: int = 20) -> Any:
    for attempt in range(attempts):
        try:
            return await call()
        except (KernelError, TimeoutError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")
