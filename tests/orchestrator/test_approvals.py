"""Runs awaiting decisions, driven through the orchestrator's ``finished`` and ``approve`` endpoints as a
worker and a decider drive them: a report that arrives late (a request a slow replica takes after the
worker's retry was answered, a redelivered message's report) never rolls the run back to an older wait."""

from __future__ import annotations

import msgspec
import pytest

from plexus.core import AgentId, TextBlock
from plexus.orchestrator import Orchestrator
from plexus.runtime import Runtime
from plexus.runtime.orchestration import FinishedReport, RunRecord, RunStateError, RunStatus

from .conftest import call

PAYER = AgentId("echo", "payer")


def _waits(run_id: str, suspension: str, *ids: str) -> FinishedReport:
    """The run-end report of a handler that ended with ``await_approval(ids, suspension=suspension)``."""
    return FinishedReport(
        run_id=run_id, status="awaiting_approval", awaiting=list(ids), suspension=suspension
    )


def _wait_of(record: RunRecord) -> tuple[str, str | None, list[str], list[str]]:
    return (str(record.status), record.suspension, record.awaiting, record.decided)


async def test_a_late_report_of_an_older_suspension_leaves_the_newer_wait_alone(
    orch: Orchestrator, rt: Runtime
) -> None:
    """The first turn's report (suspension s1) taken again after the second turn's (s2), both reusing
    ``call_0``: the run stays in s2, its pending id pending and, once decided, decided (a rollback to s1
    would reopen the decision and make the run wait for a call its agent no longer waits for)."""
    run_id = await rt.start_run(PAYER, [TextBlock(text="pay twice")])
    first = await call(rt, "finished", _waits(run_id, "s1", "call_0"), RunRecord)
    assert _wait_of(first) == (RunStatus.AWAITING_APPROVAL, "s1", ["call_0"], [])
    decided = await rt.approve(run_id, "call_0", suspension="s1")
    assert _wait_of(decided) == (RunStatus.RUNNING, "s1", [], ["call_0"])
    second = await call(rt, "finished", _waits(run_id, "s2", "call_0"), RunRecord)
    assert _wait_of(second) == (RunStatus.AWAITING_APPROVAL, "s2", ["call_0"], [])

    late = await call(rt, "finished", _waits(run_id, "s1", "call_0"), RunRecord)
    assert _wait_of(late) == (RunStatus.AWAITING_APPROVAL, "s2", ["call_0"], [])
    assert _wait_of(await rt.get_run(run_id)) == _wait_of(second)

    # A decision for the ended wait is refused (the retry of s1's decision never takes s2's call_0) ...
    with pytest.raises(RunStateError):
        await rt.approve(run_id, "call_0", suspension="s1")
    # ... s2's is taken, and neither a late s1 report nor a repeated s2 one reopens it.
    taken = await rt.approve(run_id, "call_0", suspension="s2")
    assert _wait_of(taken) == (RunStatus.RUNNING, "s2", [], ["call_0"])
    for report in (_waits(run_id, "s1", "call_0"), _waits(run_id, "s2", "call_0")):
        again = await call(rt, "finished", report, RunRecord)
        assert _wait_of(again) == (RunStatus.RUNNING, "s2", [], ["call_0"])

    # The next wait is still new (a third turn's call_0), and the run ends as its agent reports.
    third = await call(rt, "finished", _waits(run_id, "s3", "call_0"), RunRecord)
    assert _wait_of(third) == (RunStatus.AWAITING_APPROVAL, "s3", ["call_0"], [])
    assert third.ended_suspensions == ["s1", "s2"]
    done = await call(rt, "finished", FinishedReport(run_id=run_id, status="completed"), RunRecord)
    assert done.status == RunStatus.COMPLETED


async def test_a_run_remembers_its_last_32_ended_suspensions(orch: Orchestrator, rt: Runtime) -> None:
    """The memory of ended waits is bounded (a long-lived run's record does not grow with its turns), and a
    record written before it existed (no ``ended_suspensions``) decodes with none."""
    run_id = await rt.start_run(PAYER, [TextBlock(text="many turns")])
    for turn in range(40):
        record = await call(rt, "finished", _waits(run_id, f"s{turn}", "call_0"), RunRecord)
    assert record.suspension == "s39"
    assert record.ended_suspensions == [f"s{turn}" for turn in range(7, 39)]
    late = await call(rt, "finished", _waits(run_id, "s7", "call_0"), RunRecord)
    assert (late.suspension, late.ended_suspensions[0]) == ("s39", "s7")

    written_before = msgspec.to_builtins(record)
    del written_before["ended_suspensions"]
    legacy = msgspec.json.decode(msgspec.json.encode(written_before), type=RunRecord)
    assert (legacy.suspension, legacy.ended_suspensions) == ("s39", [])
