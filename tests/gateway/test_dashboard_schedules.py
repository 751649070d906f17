"""The dashboard's schedules page in real headless Chromium (issue 40, item 3): scheduled runs with their next
fires and last runs, the fires of a 1-second schedule appearing live, a last run's link opening its tree, and
the pause, resume, trigger and delete buttons acting on the cluster."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Dialog, Page, async_playwright, expect

from plexus.core import AgentId, TextBlock
from plexus.runtime import ScheduleNotFoundError

from .browser import CHROMIUM_ARGS, ensure_chromium
from .conftest import TOKEN, Stack

pytestmark = pytest.mark.timeout(240)
# The machine running the suite may be busy: give the page time, never a speed target.
expect.set_options(timeout=30_000)


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    executable = ensure_chromium()
    async with async_playwright() as pw:
        browser: Browser = await pw.chromium.launch(
            executable_path=executable, args=CHROMIUM_ARGS, headless=True
        )
        errors: list[str] = []
        try:
            context = await browser.new_context(viewport={"width": 1400, "height": 900})
            page = await context.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
        finally:
            await browser.close()
        assert errors == [], f"JavaScript errors on the page: {errors}"


def row(page: Page, schedule_id: str) -> str:
    return f'#schedules tr[data-schedule="{schedule_id}"]'


async def test_schedules_page_lists_fires_live_links_runs_and_its_buttons_act(
    gw: Stack, page: Page, tmp_path: Path
) -> None:
    rt = gw.rt
    await rt.schedule_run(
        AgentId("echo", "nightly"),
        [TextBlock(text="night")],
        cron="0 3 * * *",
        tz="Europe/Paris",
        schedule_id="nightly",
    )
    await rt.schedule_run(
        AgentId("echo", "hourly"), [TextBlock(text="hour")], every=_seconds(3600), schedule_id="hourly"
    )

    await page.goto(f"{gw.url}/?token={TOKEN}#schedules")
    await expect(page.locator("#schedules-pane")).to_be_visible()
    await expect(page.locator("#tree-pane")).to_be_hidden()
    nightly, hourly = row(page, "nightly"), row(page, "hourly")
    await expect(page.locator(nightly)).to_contain_text("cron 0 3 * * * (Europe/Paris)")
    await expect(page.locator(f"{nightly} .sched-next")).to_contain_text("in ")
    await expect(page.locator(f"{hourly} .sched-next")).to_contain_text("in 60 min")
    await expect(page.locator("#schedules-count")).to_contain_text("2 of at most 100")

    # A schedule created meanwhile fires every second: its started runs appear without a reload.
    await rt.schedule_run(
        AgentId("echo", "tick"),
        [TextBlock(text="tick")],
        every=_seconds(1),
        overlap="allow",
        schedule_id="tick",
    )
    await page.locator("#schedules-refresh").click()
    await expect(page.locator(f"{row(page, 'tick')} a.sched-run").first).to_be_visible()

    # Trigger: a manual fire starts a run, listed with its status and a link to its tree.
    await page.locator(f"{hourly} .sched-trigger").click()
    link = page.locator(f"{hourly} a.sched-run")
    await expect(link).to_have_count(1)
    await expect(page.locator(f"{hourly} .sched-runs .badge").first).to_have_attribute(
        "data-status", "completed"
    )
    await expect(page.locator(f"{hourly} .sched-runs")).to_contain_text("(trigger)")
    run_id = await link.text_content()
    assert (run_id or "").startswith("run_hourly."), run_id
    assert run_id is not None
    await link.click()
    await expect(page.locator("#tree-pane")).to_be_visible()
    await expect(page.locator("#schedules-pane")).to_be_hidden()
    await expect(page.locator("#tree-title")).to_have_text(run_id)
    await expect(page.locator('li.tree-node[data-agent="echo/hourly"]')).to_have_attribute(
        "data-status", "completed"
    )

    # Pause and resume from the page: the cluster's schedule follows.
    await page.locator("#nav-schedules").click()
    await expect(page.locator("#tree-pane")).to_be_hidden()
    await page.locator(f"{nightly} .sched-pause").click()
    await expect(page.locator(nightly)).to_have_attribute("data-paused", "true")
    await expect(page.locator(f"{nightly} .sched-next")).to_have_text("paused")
    assert (await rt.get_schedule("nightly")).schedule.paused
    await page.screenshot(path=str(tmp_path / "dashboard-schedules.png"), full_page=True)
    await page.locator(f"{nightly} .sched-resume").click()
    await expect(page.locator(nightly)).to_have_attribute("data-paused", "false")
    assert not (await rt.get_schedule("nightly")).schedule.paused

    # Delete asks first; a dismissed question deletes nothing, an accepted one deletes.
    async def dismiss(dialog: Dialog) -> None:
        await dialog.dismiss()

    page.once("dialog", dismiss)
    await page.locator(f"{row(page, 'tick')} .sched-delete").click()
    await expect(page.locator(f"{row(page, 'tick')} .sched-delete")).to_be_enabled()
    assert (await rt.get_schedule("tick")).schedule.id == "tick"

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.once("dialog", accept)
    await page.locator(f"{row(page, 'tick')} .sched-delete").click()
    await expect(page.locator(row(page, "tick"))).to_have_count(0)
    with pytest.raises(ScheduleNotFoundError):
        await rt.get_schedule("tick")
    await expect(page.locator("#schedules-count")).to_contain_text("2 of at most 100")


def _seconds(n: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=n)
