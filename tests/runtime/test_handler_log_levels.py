"""A failed handler is one line on ``plexus.worker`` at the level its error calls for: a fault at WARNING, a
decision (a spent budget) at INFO, a cancellation at DEBUG (every agent of a cancelled tree ends with one)."""

from __future__ import annotations

import logging

import pytest

from plexus.core import AgentId, BaseBlock, BudgetExhaustedError, CancellationError, KernelError, TextBlock
from plexus.runtime import Agent, App, Context, Runtime

from .conftest import StartWorker


class Failing(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        kind = "".join(getattr(b, "text", "") for b in blocks)
        if kind == "cancel":
            raise CancellationError("the tree was cancelled")
        if kind == "budget":
            raise BudgetExhaustedError("tokens", 10, 9)
        raise ValueError("a bug")


@pytest.mark.parametrize(
    ("kind", "level"), [("bug", logging.WARNING), ("budget", logging.INFO), ("cancel", logging.DEBUG)]
)
async def test_a_failed_handler_is_logged_at_the_level_its_error_calls_for(
    runtime: Runtime, start_worker: StartWorker, caplog: pytest.LogCaptureFixture, kind: str, level: int
) -> None:
    app = App()
    app.register("failing", lambda _id: Failing())
    await start_worker(app)
    caplog.set_level(logging.DEBUG, logger="plexus.worker")
    with pytest.raises(KernelError):
        await runtime.send_message([TextBlock(text=kind)], AgentId("failing", kind), timeout=20)
    lines = [r for r in caplog.records if r.name == "plexus.worker" and "handler failed" in r.getMessage()]
    assert [r.levelno for r in lines] == [level], [r.getMessage() for r in lines]
    assert lines[0].agent_id == f"failing/{kind}"  # type: ignore[attr-defined]
