"""Token figures are labelled wherever runs are listed or shown (issue 44): "own" is what a run's own agent
spent, "tree" its whole tree's total (CLI runs ls and show, the HTTP run resource, the dashboard)."""

from __future__ import annotations

import asyncio
import json

from playwright.async_api import Page, expect

from .conftest import TOKEN, Stack
from .test_cli import plexus, text
from .test_dashboard import browser, page  # noqa: F401 - fixtures

# Two leaves spending 4 tokens a step for 2 steps: each spends 8 itself, the tree 16; the root none.
CMD = json.dumps({"children": 2, "leaf": {"steps": 2, "tokens": 4}})


async def settled_tree(gw: Stack, key: str) -> tuple[str, list[str]]:
    started = await gw.client.post("/v1/runs", json={"agent_id": f"fanout/{key}", "input": text(CMD)})
    run_id = str(started.json()["run_id"])
    root = await gw.rt.wait_run(run_id, timeout=30)
    assert root.status == "completed"
    async with asyncio.timeout(20):  # the records settle (see docs/architecture.md)
        while (await gw.rt.get_run(run_id)).usage.tokens != 16:  # noqa: ASYNC110 - records, no event
            await asyncio.sleep(0.1)
    return run_id, list((await gw.rt.get_run(run_id)).children)


async def test_the_cli_and_the_run_resource_label_own_and_tree_tokens(gw: Stack) -> None:
    run_id, children = await settled_tree(gw, "labels")
    assert len(children) == 2
    nats = ("--nats", gw.nats_url)

    code, out, err = await plexus("runs", "ls", *nats)
    assert code == 0, err
    assert f"{run_id}  completed  fanout/labels  own=0 tree=16" in out
    code, out, err = await plexus("runs", "ls", "--all", *nats)
    assert code == 0, err
    for child in children:
        assert f"{child}  completed  leaf/labels-" in out
        assert any(line.startswith(child) and line.endswith("own=8 tree=-") for line in out.splitlines())

    code, out, err = await plexus("runs", "show", run_id, *nats)
    assert code == 0, err
    assert "fanout/labels  completed  tokens own=0 tree=16" in out
    assert "  leaf/labels-0  completed  tokens own=8" in out
    assert "tree tokens 16 (no limit)" in out

    child = (await gw.client.get(f"/v1/runs/{children[0]}")).json()
    assert child["tokens"] == {"own": 8, "tree": 16}
    root = (await gw.client.get(f"/v1/runs/{run_id}")).json()
    assert root["tokens"] == {"own": 0, "tree": 16}


async def test_the_dashboard_labels_own_and_tree_tokens(gw: Stack, page: Page) -> None:  # noqa: F811
    run_id, _ = await settled_tree(gw, "dash")
    await page.goto(f"{gw.url}/?token={TOKEN}#run={run_id}")
    root = page.locator('li.tree-node[data-agent="fanout/dash"] > .node .meta').first
    await expect(root).to_have_attribute("data-own", "0")
    await expect(root).to_have_attribute("data-tree", "16")
    await expect(root).to_contain_text("tokens own 0 · tree 16")
    leaf = page.locator('li.tree-node[data-agent="leaf/dash-0"] > .node .meta').first
    await expect(leaf).to_have_attribute("data-own", "8")
    await expect(leaf).to_contain_text("tokens own 8")
    await expect(leaf).not_to_have_attribute("data-tree", "16")
    await expect(page.locator(".gauge").first).to_contain_text("tree tokens")
