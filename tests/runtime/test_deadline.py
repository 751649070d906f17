"""DeadlineInterceptor semantics: cooperative stop first, hard cancel after the grace, no false deadlines."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

from plexus.core import AgentId, CancellationError, TextBlock
from plexus.runtime import Agent, AgentType, Context, HandleInput
from plexus.runtime.kernel import Envelope
from plexus.runtime.ops._ticks import wheel_of
from plexus.runtime.worker.pipeline._deadline import DeadlineInterceptor

OK, STOPPED, SWALLOWED = TextBlock(text="ok"), TextBlock(text="stopped"), TextBlock(text="swallowed")


def inp(deadline: float | None, limit: float | None) -> HandleInput:
    """A real HandleInput; the interceptor reads the envelope deadline, the type's limit and the context."""
    agent_id = AgentId("t", "k")
    ctx = Context(
        agent_id=agent_id,
        message_id="m",
        sender=None,
        topic=None,
        run=None,
        is_rpc=False,
        attempt=0,
        _backend=None,  # type: ignore[arg-type]  # the deadline interceptor never calls the backend
    )
    envelope = Envelope(
        id="m",
        kind="send",
        target=str(agent_id),
        payload=msgspec.Raw(b"[]"),
        sent_at=time.time(),
        deadline=deadline,
    )
    agent_type = AgentType(name="t", factory=lambda _id: Agent(), time_limit_s=limit)
    return HandleInput(
        agent=Agent(), agent_type=agent_type, blocks=[], ctx=ctx, envelope=envelope, delivery=None
    )


async def test_no_limit_runs_plainly() -> None:
    async def nxt(_: Any) -> Any:
        return [OK]

    assert await DeadlineInterceptor().handle(inp(None, None), nxt) == [OK]


async def test_past_deadline_fails_before_running() -> None:
    ran = False

    async def nxt(_: Any) -> Any:
        nonlocal ran
        ran = True

    with pytest.raises(CancellationError, match="deadline"):
        await DeadlineInterceptor().handle(inp(time.time() - 1, None), nxt)
    assert not ran


@pytest.mark.parametrize(("deadline", "limit"), [(0.2, None), (None, 0.2), (30.0, 0.2), (0.2, 30.0)])
async def test_cooperative_handler_sees_token_then_returns(
    deadline: float | None, limit: float | None
) -> None:
    i = inp(None if deadline is None else time.time() + deadline, limit)

    async def nxt(x: Any) -> Any:
        await x.ctx.cancellation.wait()
        return [STOPPED]

    assert await DeadlineInterceptor().handle(i, nxt) == [STOPPED]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_ignoring_handler_is_cancelled_after_grace() -> None:
    i = inp(time.time() + 0.1, None)

    async def nxt(_: Any) -> Any:
        await asyncio.sleep(30)

    t0 = time.monotonic()
    with pytest.raises(CancellationError, match="deadline"):
        await DeadlineInterceptor().handle(i, nxt)
    assert time.monotonic() - t0 < 1.0
    assert i.ctx.cancellation.is_cancelled
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_handler_swallowing_cancel_returns_and_counter_is_restored() -> None:
    i = inp(time.time() + 0.05, None)

    async def nxt(_: Any) -> Any:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return [SWALLOWED]

    assert await DeadlineInterceptor().handle(i, nxt) == [SWALLOWED]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_outer_cancellation_is_not_a_deadline() -> None:
    started = asyncio.Event()

    async def nxt(_: Any) -> Any:
        started.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(DeadlineInterceptor().handle(inp(time.time() + 30, None), nxt))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_outer_cancellation_racing_the_deadline_stays_a_cancellation() -> None:
    started = asyncio.Event()

    async def nxt(_: Any) -> Any:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.3)  # our hard cancel lands here too

    task = asyncio.create_task(DeadlineInterceptor().handle(inp(time.time() + 0.05, None), nxt))
    await started.wait()
    await asyncio.sleep(0.07)  # cooperative fired; hard cancel pending
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_handler_timeout_error_is_not_turned_into_deadline() -> None:
    async def nxt(_: Any) -> Any:
        raise TimeoutError("my own")

    with pytest.raises(TimeoutError, match="my own"):
        await DeadlineInterceptor().handle(inp(time.time() + 30, None), nxt)


class _Sleeper(Agent):
    async def on_message(self, blocks: list[Any], ctx: Context) -> list[Any]:
        await asyncio.sleep(10)
        return [OK]


async def test_a_runs_deadline_stops_a_plain_send(runtime: Any, start_worker: Any) -> None:
    """`new_root_run(deadline=…)` on a non-orchestrated send binds the handler (it used to wait for its own
    timeout): the caller gets CancellationError("deadline") well before the send's timeout."""
    from plexus.runtime import App, new_root_run

    app = App()
    app.register("sleeper", lambda _id: _Sleeper())
    await start_worker(app)
    started = time.monotonic()
    with pytest.raises(CancellationError, match="deadline"):
        await runtime.send_message(
            [TextBlock(text="x")],
            AgentId("sleeper", "k"),
            timeout=30,
            run=new_root_run(deadline=time.time() + 0.5),
        )
    assert time.monotonic() - started < 5


async def test_the_token_fires_at_the_deadline_never_before_it() -> None:
    """Deadlines are grouped by 10 ms ticks: one may fire up to a tick late, never early."""
    deadline = time.time() + 0.12
    i = inp(deadline, None)
    fired_at: list[float] = []

    async def nxt(x: Any) -> Any:
        await x.ctx.cancellation.wait()
        fired_at.append(time.time())
        return [STOPPED]

    assert await DeadlineInterceptor().handle(i, nxt) == [STOPPED]
    assert fired_at[0] >= deadline - 0.002  # (wall and monotonic clocks drift by less than this)


async def test_handlers_that_finish_in_time_are_never_cancelled_and_leave_nothing_armed() -> None:
    interceptor = DeadlineInterceptor()
    loop = asyncio.get_running_loop()

    def live_timers() -> int:
        return sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]

    timers_before = live_timers()
    deadline = time.time() + 0.5
    # Deadlines spread over many ticks, as a burst of messages has: a tick left empty keeps nothing.
    inputs = [inp(deadline + i * 0.011, None) for i in range(200)]

    async def nxt(_: Any) -> Any:
        await asyncio.sleep(0)
        return [OK]

    results = await asyncio.gather(*(interceptor.handle(i, nxt) for i in inputs))
    assert results == [[OK]] * 200
    wheel = wheel_of(loop)
    # Every expiry was disarmed, and each tick with it but the one emptied last (kept for the next message).
    assert len(wheel._ticks) <= 1
    assert not any(wheel._ticks.values())
    assert live_timers() <= timers_before + 1  # no loop timer left waiting for the burst's other ticks
    await asyncio.sleep(max(0.0, deadline - time.time()) + 0.1)  # past the first: nobody was cancelled
    assert not any(i.ctx.cancellation.is_cancelled for i in inputs)
    assert len(wheel._ticks) <= 1
    assert not any(wheel._ticks.values())


async def test_handlers_that_finish_without_waiting_share_one_loop_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each message's deadline is armed and disarmed within one step when its handler never waits: the
    next message's falls in the same tick and reuses its loop timer instead of making and cancelling one."""
    loop = asyncio.get_running_loop()
    made = 0
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        nonlocal made
        made += 1
        return call_at(when, callback, *args)

    monkeypatch.setattr(loop, "call_at", counting_call_at)

    async def nxt(_: Any) -> Any:
        return [OK]

    interceptor = DeadlineInterceptor()
    deadline = time.time() + 5.0
    for _ in range(100):
        assert await interceptor.handle(inp(deadline, None), nxt) == [OK]
    assert made <= 2  # one tick (two if the deadline sits on a tick's edge), not one timer per message


async def test_one_interceptor_serves_a_new_event_loop() -> None:
    """A worker's interceptor may outlive a loop (tests, restarts): its wheel follows the running loop."""
    interceptor = DeadlineInterceptor()

    async def nxt(x: Any) -> Any:
        await x.ctx.cancellation.wait()
        return [STOPPED]

    assert await interceptor.handle(inp(time.time() + 0.03, None), nxt) == [STOPPED]

    def in_another_loop() -> list[Any] | None:
        return asyncio.run(interceptor.handle(inp(time.time() + 0.03, None), nxt))

    assert await asyncio.to_thread(in_another_loop) == [STOPPED]
