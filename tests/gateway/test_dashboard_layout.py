"""The dashboard fits a 1280-px-wide window, and a long agent key wraps inside the runs list and the
tree instead of widening the page (real headless Chromium)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, FloatRect, Page, async_playwright, expect

from .browser import CHROMIUM_ARGS, ensure_chromium
from .conftest import TOKEN, Stack

pytestmark = pytest.mark.timeout(240)
expect.set_options(timeout=30_000)

LONG_KEY = "customer-" + "x" * 120 + "-conversation-with-a-very-long-identifier"


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    executable = ensure_chromium()
    async with async_playwright() as pw:
        browser: Browser = await pw.chromium.launch(
            executable_path=executable, args=CHROMIUM_ARGS, headless=True
        )
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 800})
            yield await context.new_page()
        finally:
            await browser.close()


async def _box(page: Page, selector: str) -> FloatRect:
    # The runs list is rebuilt as the cluster changes: an element can be replaced between two reads.
    for _ in range(50):
        box = await page.locator(selector).first.bounding_box()
        if box is not None:
            return box
        await page.wait_for_timeout(100)
    raise AssertionError(f"{selector} is not laid out")


async def test_long_keys_wrap_and_the_page_fits_1280_px(gw: Stack, page: Page) -> None:
    started = await gw.client.post(
        "/v1/runs", json={"agent_id": f"echo/{LONG_KEY}", "input": [{"type": "text", "text": "hi"}]}
    )
    run_id = started.json()["run_id"]
    await gw.rt.wait_run(run_id, timeout=30)

    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}")
    await expect(page.locator(f'#runs li[data-run="{run_id}"]')).to_be_visible()
    await expect(page.locator(f'li.tree-node[data-agent="echo/{LONG_KEY}"]')).to_be_visible()

    widths = await page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1] == 1280, f"the page scrolls sideways: {widths}"
    pane = await _box(page, "#runs-pane")
    item = await _box(page, f'#runs li[data-run="{run_id}"]')
    assert item["x"] + item["width"] <= pane["x"] + pane["width"] + 1, (item, pane)
    assert item["height"] > 30  # the key wrapped onto more lines rather than running out of its pane
    tree = await _box(page, "#tree-pane")
    node = await _box(page, f'li.tree-node[data-agent="echo/{LONG_KEY}"] .node')
    assert node["x"] + node["width"] <= tree["x"] + tree["width"] + 1, (node, tree)
    detail = await _box(page, "aside#detail")
    assert detail["x"] + detail["width"] <= 1280, detail
