"""The dashboard in real headless Chromium: a run tree appears and updates live, a budget gauge moves,
the cancel button cancels every node, and a screenshot is saved to the test's output directory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from .browser import CHROMIUM_ARGS, ensure_chromium
from .conftest import TOKEN, Stack

pytestmark = pytest.mark.timeout(240)
# The machine running the suite may be busy: give the page time, never a speed target.
expect.set_options(timeout=30_000)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = ensure_chromium()
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        await context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


async def test_tree_appears_updates_gauge_moves_and_cancel_cancels_every_node(
    gw: Stack, page: Page, tmp_path: Path
) -> None:
    cmd = json.dumps({"children": 3, "leaf": {"steps": 400, "tokens": 3, "sleep": 0.05}})
    started = await gw.client.post(
        "/v1/runs",
        json={"agent_id": "fanout/ui", "input": text(cmd), "budget": {"max_tokens": 100000}},
    )
    run_id = started.json()["run_id"]

    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}")
    # The tree appears: the root and its three leaves, keyed by AgentId.
    await expect(page.locator('li.tree-node[data-agent="fanout/ui"]')).to_be_visible()
    for i in range(3):
        await expect(page.locator(f'li.tree-node[data-agent="leaf/ui-{i}"]')).to_have_attribute(
            "data-status", "running"
        )
    # The root waits on its children; the runs list shows the run.
    await expect(page.locator('li.tree-node[data-agent="fanout/ui"]')).to_have_attribute(
        "data-status", "waiting on children"
    )
    await expect(page.locator(f'#runs li[data-run="{run_id}"]')).to_be_visible()

    # The token gauge moves while the leaves spend tokens.
    gauge = page.locator("#g-tokens")
    await expect(gauge).not_to_have_attribute("data-used", "0")
    first = int(await gauge.get_attribute("data-used") or "0")
    await expect(gauge).not_to_have_attribute("data-used", str(first))
    later = int(await gauge.get_attribute("data-used") or "0")
    assert later > first > 0

    # Selecting a leaf shows its streamed steps and a link to its parent; the link navigates up.
    await page.locator('li.tree-node[data-agent="leaf/ui-1"] > .node').click()
    await expect(page.locator("#d-title")).to_have_text("leaf/ui-1")
    await expect(page.locator("#d-stream")).to_contain_text("step")
    await page.locator("#d-links .nav-parent").click()
    await expect(page.locator("#d-title")).to_have_text("fanout/ui")

    # The synchronized timeline: one bar per node on the tree's axis, which advances while runs go on.
    axis = page.locator("#t-axis")
    await expect(axis).to_contain_text("timeline:")
    before = await axis.text_content()
    await expect(axis).not_to_have_text(before or "", timeout=5_000)
    await expect(page.locator("li.tree-node .timeline .bar")).to_have_count(4)

    await page.screenshot(path=str(tmp_path / "dashboard-running.png"), full_page=True)

    await page.locator("#cancel").click()
    for agent in ("fanout/ui", "leaf/ui-0", "leaf/ui-1", "leaf/ui-2"):
        await expect(page.locator(f'li.tree-node[data-agent="{agent}"]')).to_have_attribute(
            "data-status", "cancelled", timeout=30_000
        )
    await expect(page.locator("#tree-status")).to_have_attribute("data-status", "cancelled")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "ended")
    await expect(page.locator("#cancel")).to_be_disabled()
    bars = await page.eval_on_selector_all(
        "li.tree-node > .node .timeline .bar",
        "els => els.map(e => [e.closest('li').dataset.agent, +e.dataset.from, +e.dataset.to])",
    )
    spans = {agent: (start, end) for agent, start, end in bars}
    assert set(spans) == {"fanout/ui", "leaf/ui-0", "leaf/ui-1", "leaf/ui-2"}
    assert spans["fanout/ui"][0] == 0.0  # the axis starts with the root
    assert all(0.0 <= start <= end <= 1.0 for start, end in spans.values()), spans
    assert all(spans[f"leaf/ui-{i}"][0] > 0.0 for i in range(3))  # children start after their parent
    assert max(end for _, end in spans.values()) == 1.0  # and the axis ends with the last end
    shot = tmp_path / "dashboard-cancelled.png"
    await page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    record = await gw.rt.wait_run(run_id, timeout=30)
    assert record.status == "cancelled"


async def test_wide_fan_out_collapses_into_a_group_and_failed_only_filters(gw: Stack, page: Page) -> None:
    cmd = json.dumps({"children": 8, "leaf": {"steps": 1}})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "fanout/wide", "input": text(cmd)})).json()[
        "run_id"
    ]
    await gw.rt.wait_run(run_id, timeout=60)
    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}")
    group = page.locator('li.group[data-group="leaf"]')
    await expect(group).to_contain_text("8 × leaf")
    await expect(group.locator('.badge[data-status="completed"]')).to_have_text("completed 8")
    await group.locator(".node").click()
    await expect(page.locator("li.tree-node")).to_have_count(9)
    await page.locator("#t-failed").check()
    await expect(page.locator("li.tree-node")).to_have_count(0)


async def test_workers_page_lists_live_workers(gw: Stack, page: Page) -> None:
    await page.goto(f"{gw.url}/?token={TOKEN}#workers")
    await expect(page.locator("#workers tr")).to_have_count(1)
    await expect(page.locator("#workers")).to_contain_text("default/leaf")
    await expect(page.locator("#workers")).to_contain_text(
        "default/leaf: 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    )


async def test_each_llm_agent_shows_its_model_usage_and_the_tree_rolls_it_up(gw: Stack, page: Page) -> None:
    """Tokens in / out / cached / reasoning per node, from the usage plexus.llm reports with its progress."""
    started = await gw.client.post("/v1/runs", json={"agent_id": "llm/ui", "input": text("what is plexus?")})
    run_id = started.json()["run_id"]
    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}")
    usage = page.locator('li.tree-node[data-agent="llm/ui"] > .node .usage')
    await expect(usage).to_have_attribute("data-input", "320")  # 120 + 200 over the two turns
    await expect(usage).to_have_attribute("data-output", "70")
    await expect(usage).to_have_attribute("data-cached", "120")
    await expect(usage).to_have_attribute("data-reasoning", "15")
    await expect(usage).to_contain_text("in 320 · out 70 · cached 120 · reasoning 15")
    await expect(page.locator("#t-usage")).to_have_attribute("data-input", "320")


async def test_a_handoff_child_is_marked_in_the_tree(gw: Stack, page: Page) -> None:
    """An LLM agent's handoff (plexus.llm): the child that took the conversation says from whom, and the
    agent that handed off says to whom."""
    started = await gw.client.post("/v1/runs", json={"agent_id": "triage/ui", "input": text("help me")})
    run_id = started.json()["run_id"]
    await gw.rt.wait_run(run_id, timeout=60)
    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}")
    child = page.locator('li.tree-node[data-agent^="helpdesk/"]')
    await expect(child).to_have_attribute("data-handoff", "triage/ui")
    await expect(child.locator("> .node .handoff")).to_have_text("handoff from triage/ui")
    await expect(child).to_have_attribute("data-status", "completed")
    helpdesk = await child.get_attribute("data-agent")
    root = page.locator('li.tree-node[data-agent="triage/ui"]')
    await expect(root.locator("> .node .handoff")).to_have_text(f"handed off to {helpdesk}")
    await expect(root.locator("> .node .handoff")).to_be_visible()


async def test_the_runs_list_follows_new_runs_without_a_refresh(gw: Stack, page: Page) -> None:
    await page.goto(f"{gw.url}/?token={TOKEN}")
    await expect(page.locator("#runs")).to_have_attribute("data-live", "live")
    started = await gw.client.post("/v1/runs", json={"agent_id": "echo/live-list", "input": text("hi")})
    run_id = started.json()["run_id"]
    row = page.locator(f'#runs li[data-run="{run_id}"]')
    await expect(row).to_be_visible(timeout=10_000)  # nobody clicked Refresh
    await expect(row.locator(".badge")).to_have_attribute("data-status", "completed", timeout=10_000)


async def test_selected_agent_shows_its_streamed_text(gw: Stack, page: Page) -> None:
    started = await gw.client.post(
        "/v1/runs", json={"agent_id": "streamer/ui", "input": text(json.dumps({"rounds": 100}))}
    )
    run_id = started.json()["run_id"]
    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}&node={run_id}")
    await expect(page.locator("#d-title")).to_have_text("streamer/ui")
    await expect(page.locator("#d-stream")).to_contain_text("tok")
    await gw.client.post(f"/v1/runs/{run_id}/cancel")


async def test_a_wrong_token_closes_the_stream_and_asks_for_one(gw: Stack, page: Page) -> None:
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "echo/tok", "input": text("x")})).json()[
        "run_id"
    ]
    await page.goto(f"{gw.url}/?token=wrong#run={run_id}")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "closed")
    await expect(page.locator("#auth")).to_be_visible()
    await page.locator("#token").fill(TOKEN)
    await page.locator("#token-save").click()
    await expect(page.locator('li.tree-node[data-agent="echo/tok"]')).to_have_attribute(
        "data-status", "completed"
    )
