"""The transcript view in real headless Chromium: an LLM agent's node opens its turns (model items, tool calls
with their arguments and results, usage, finish), "fork from here" with an edited message starts a fork, and
the fork is shown beside its source, filled in live as it runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from plexus.gateway import hash_token

from . import apps_transcript, test_dashboard
from .conftest import TOKEN, Stack

assert apps_transcript.app.get("tx-flaky") is not None  # imported for the agent types it registers
browser = test_dashboard.browser  # the Chromium fixtures
tab = test_dashboard.page  # a page of its own context, failing on JavaScript errors

pytestmark = pytest.mark.timeout(240)
expect.set_options(timeout=30_000)


async def test_the_transcript_opens_from_a_node_and_forks_from_a_turn_side_by_side(
    gw: Stack, tab: Page, tmp_path: Path
) -> None:
    started = await gw.client.post(
        "/v1/runs", json={"agent_id": "llm/ui-tx", "input": [{"type": "text", "text": "find plexus"}]}
    )
    run_id = started.json()["run_id"]
    page = tab
    assert (await gw.rt.wait_run(run_id, timeout=60)).status == "completed"

    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}&node={run_id}")
    await expect(page.locator("#d-title")).to_have_text("llm/ui-tx")
    await page.locator("#d-transcript").click()
    main = page.locator("#tx-main")
    await expect(main).to_have_attribute("data-agent", "llm/ui-tx")
    await expect(main.locator(".tx-input")).to_contain_text("find plexus")
    turns = main.locator(".tx-turn")
    await expect(turns).to_have_count(2)
    first = turns.nth(0)
    await expect(first.locator(".tx-turn-head")).to_contain_text("turn 1 · tool_call · in 120 · out 30")
    await expect(first.locator(".tx-model .tx-text")).to_have_text("Looking it up.")
    await expect(first.locator(".tx-call")).to_contain_text('lookup({"q":"plexus"})')
    await expect(first.locator(".tx-result")).to_contain_text("found plexus")
    await expect(turns.nth(1).locator(".tx-model .tx-text")).to_have_text("Found it.")
    await expect(turns.nth(1).locator(".tx-turn-head")).to_contain_text("completed")

    # Fork from turn 1 with an edited message: the fork opens beside its source and fills in live.
    await first.locator(".tx-fork").click()
    await expect(page.locator("#tx-fork-point")).to_have_text("after turn 1")
    await page.locator("#tx-edit-message").fill("and once more")
    await page.locator("#tx-fork-go").click()
    lineage = f"forked from llm/ui-tx in {run_id} after turn 1"
    await expect(main.locator(".tx-lineage")).to_contain_text(lineage)
    source = page.locator("#tx-source")
    await expect(source).to_be_visible()
    await expect(source).to_have_attribute("data-run", run_id)
    await expect(source.locator('.tx-turn[data-turn="1"]')).to_have_attribute("data-shared", "true")
    await expect(source.locator(".tx-forked-here")).to_have_count(1)
    # What the fork's model saw first: the source's conversation up to turn 1, then the edit.
    await expect(main.locator(".tx-input").last).to_contain_text("and once more")
    await expect(main.locator(".tx-input")).to_contain_text(["find plexus", "Looking it up."])
    await expect(main.locator(".tx-turn")).to_have_count(2)
    await expect(main).to_have_attribute("data-live", "false")
    fork_run = await main.get_attribute("data-run")
    assert fork_run is not None
    assert fork_run != run_id
    record = await gw.rt.get_run(fork_run)
    assert record.forked_from == {"run_id": run_id, "agent_id": "llm/ui-tx", "message": 0, "turn": 1}
    await page.screenshot(path=str(tmp_path / "transcript-fork.png"), full_page=True)


async def test_the_transcript_shows_each_approval_with_who_decided(gw: Stack, tab: Page) -> None:
    """Two gated turns of a run: the first decided by the bearer token (its identity by default), the second
    denied with an explicit ``decided_by``; the route and the view name the decider of each."""
    started = await gw.client.post(
        "/v1/runs", json={"agent_id": "tx-gated/ui-ap", "input": [{"type": "text", "text": "open both"}]}
    )
    run_id = started.json()["run_id"]
    await gw.rt.wait_run(run_id, timeout=30, until=("awaiting_approval",))
    ok = await gw.client.post(f"/v1/runs/{run_id}/approve", json={"decision_id": "call_0"})
    assert ok.status_code == 200, ok.text
    await gw.rt.wait_run(run_id, timeout=30, until=("awaiting_approval", "completed", "failed"))
    no = await gw.client.post(
        f"/v1/runs/{run_id}/approve",
        json={"decision_id": "call_0", "approved": False, "reason": "not now", "decided_by": "alice"},
    )
    assert no.status_code == 200, no.text
    assert (await gw.rt.wait_run(run_id, timeout=30)).status == "completed"

    token = f"token:{hash_token(TOKEN)[:12]}"
    shown = (await gw.client.get(f"/v1/runs/{run_id}/transcript")).json()
    decisions = [
        (a["approved"], a["decided_by"], a["reason"]) for m in shown["messages"] for a in m["approvals"]
    ]
    assert decisions == [(True, token, ""), (False, "alice", "not now")]

    page = tab
    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}&node={run_id}")
    await expect(page.locator("#d-title")).to_have_text("tx-gated/ui-ap")
    await page.locator("#d-transcript").click()
    approvals = page.locator("#tx-main .tx-approval")
    await expect(approvals).to_have_text([f"approved call_0 by {token}", "denied call_0 by alice: not now"])


async def test_the_transcript_shows_a_turns_provider_retries(gw: Stack, tab: Page) -> None:
    """A 429 on the first call of a turn is retried in the handler (ProviderRetry): the route and the view
    show the failed attempt, its error and the wait, on the turn it belongs to."""
    started = await gw.client.post(
        "/v1/runs", json={"agent_id": "tx-flaky/ui-rt", "input": [{"type": "text", "text": "hello"}]}
    )
    run_id = started.json()["run_id"]
    assert (await gw.rt.wait_run(run_id, timeout=30)).status == "completed"
    shown = (await gw.client.get(f"/v1/runs/{run_id}/transcript")).json()
    (turn,) = shown["messages"][0]["turns"]
    assert turn["retries"] == [
        {"attempt": 1, "error_type": "RateLimitError", "message": "slow down", "wait_s": 0.05}
    ]

    page = tab
    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}&node={run_id}")
    await expect(page.locator("#d-title")).to_have_text("tx-flaky/ui-rt")
    await page.locator("#d-transcript").click()
    await expect(page.locator("#tx-main .tx-turn .tx-retry")).to_have_text(
        "retry after attempt 1: RateLimitError: slow down (waited 0.05 s)"
    )
    await expect(page.locator("#tx-main .tx-model .tx-text")).to_have_text("Recovered.")
