"""One turn's tool step: the model's tool calls run (parallel, sequential or batched, as each tool says) and
answered, every failure as an ErrorBlock the model sees.

`ToolStep` runs the calls of one turn through the tool middleware, records ``RunToolCalled`` and
``RunToolResult``, and emits the ``tool_call`` / ``tool_result`` progress steps; `LLMAgent` journals
its result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from plexus.core import (
    AgentStep,
    CancellationError,
    ErrorBlock,
    Item,
    ItemKind,
    JsonValue,
    KernelError,
    RunToolCalled,
    RunToolResult,
    ToolResultBlock,
    ToolUseBlock,
)
from plexus.runtime import Context

from ._accumulate import INVALID_ARGUMENTS_KEY
from ._middleware import Middleware, ToolCall, chain
from ._tools import Tool, ToolArgumentsError, ToolRegistry, tool_output_blocks

__all__ = ["ToolStep"]


class ToolStep:
    """The tool step of one turn. ``decisions``: call id -> the approval decision of an approval-gated call
    (a call of a tool that needs approval runs only when approved)."""

    def __init__(
        self,
        tools: ToolRegistry,
        middleware: Sequence[Middleware],
        check_max_age: float,
        decisions: Mapping[str, Mapping[str, Any]],
    ) -> None:
        self.tools = tools
        self.middleware = middleware
        self.check_max_age = check_max_age
        self.decisions = decisions

    async def run(self, ctx: Context, calls: list[ToolUseBlock]) -> Item:
        """Answer every call of ``calls``: the TOOL item with one result per call, in the calls' order."""
        results: dict[str, ToolResultBlock] = {}
        modes = {c.call_id: (t.mode if (t := self.tools.get(c.tool_name)) else "parallel") for c in calls}
        together = [c for c in calls if modes[c.call_id] != "sequential"]
        sequential = [c for c in calls if modes[c.call_id] == "sequential"]
        grouped: dict[str, list[ToolUseBlock]] = {}
        for c in together:
            if modes[c.call_id] == "batch":
                grouped.setdefault(c.tool_name, []).append(c)
        batches: dict[str, _Batch] = {}
        for name, group in grouped.items():
            t = self.tools.get(name)
            assert t is not None  # a batch mode was read from it
            batches[name] = _Batch(self, t, ctx, group)
        try:
            if len(together) == 1:  # the common case: no task of its own to wait for
                outcomes = [await self._call(ctx, together[0], batches.get(together[0].tool_name))]
            else:
                outcomes = await _all([self._call(ctx, c, batches.get(c.tool_name)) for c in together])
        finally:
            for batch in batches.values():
                await batch.close()
        results.update({c.call_id: r for c, r in zip(together, outcomes, strict=True)})
        for call in sequential:
            await ctx.check(max_age=self.check_max_age)
            results[call.call_id] = await self._call(ctx, call, None)
        return Item(kind=ItemKind.TOOL, blocks=[results[c.call_id] for c in calls])

    async def _call(self, ctx: Context, call: ToolUseBlock, batch: _Batch | None) -> ToolResultBlock:
        """One call through the tool middleware, recorded and reported; a batch tool's calls meet in
        ``batch`` after their middleware and are invoked together."""
        run_id = ctx.run_id or ctx.message_id
        ctx.record(
            RunToolCalled(
                run_id=run_id,
                agent_id=str(ctx.agent_id),
                call_id=call.call_id,
                tool_name=call.tool_name or "?",
                arguments=call.arguments,
            )
        )
        await ctx.emit_progress(AgentStep.TOOL_CALL, [call])

        async def execute(context: ToolCall) -> ToolResultBlock:
            if batch is not None:
                return await batch.execute(context.call)
            return await self._execute(context.ctx, context.call)

        try:
            result: ToolResultBlock = await chain("tool", self.middleware, execute)(ToolCall(ctx, call))
        finally:
            if batch is not None:
                batch.left(call.call_id)  # a middleware that answered (or failed) without reaching the batch
        error = next((b for b in result.content if isinstance(b, ErrorBlock)), None)
        ctx.record(
            RunToolResult(
                run_id=run_id,
                agent_id=str(ctx.agent_id),
                call_id=call.call_id,
                tool_name=call.tool_name or None,
                output=None if error else [b.model_dump(mode="json") for b in result.content],
                error=None if error is None else {"error_type": error.error_type, "message": error.message},
            )
        )
        await ctx.emit_progress(AgentStep.TOOL_RESULT, [result])
        return result

    def refusal(self, call: ToolUseBlock) -> ToolResultBlock | None:
        """The answer to a call that must not run (bad arguments, unknown tool, not approved), else None."""
        invalid = call.metadata.get(INVALID_ARGUMENTS_KEY)
        if invalid is not None:
            return _error(call, "InvalidToolArguments", _problem(invalid))
        t = self.tools.get(call.tool_name)
        if t is None:
            known = ", ".join(sorted(s.name for s in self.tools.specs)) or "none"
            return _error(call, "UnknownTool", f"no tool named {call.tool_name!r} (tools: {known})")
        if t.needs_approval:
            decision = self.decisions.get(call.call_id)
            if decision is None or not decision["approved"]:
                reason = decision["reason"] if decision else "no decision"
                return _error(call, "ApprovalDenied", f"{t.name} was not approved: {reason or 'denied'}")
        return None

    async def _execute(self, ctx: Context, call: ToolUseBlock) -> ToolResultBlock:
        """Run one call; every failure becomes an ErrorBlock the model sees, never a crash of the loop."""
        refused = self.refusal(call)
        if refused is not None:
            return refused
        t = self.tools.get(call.tool_name)
        assert t is not None
        try:
            value = await t.invoke_call(call, ctx)
        except CancellationError:
            raise
        except Exception as exc:
            return _failure(call, t, exc)
        return _answer(call, value)


def _problem(invalid: JsonValue) -> str:
    if isinstance(invalid, dict):
        return f"{invalid.get('problem')}; raw arguments: {invalid.get('raw')!s:.500}"
    return str(invalid)


def _answer(call: ToolUseBlock, value: Any) -> ToolResultBlock:
    """What a tool returned for ``call``, as its result (a ToolResultBlock of its own keeps its flags)."""
    if isinstance(value, ToolResultBlock):
        return value.model_copy(update={"call_id": call.call_id})
    return ToolResultBlock(call_id=call.call_id, content=tool_output_blocks(value))


def _failure(call: ToolUseBlock, t: Tool, exc: Exception) -> ToolResultBlock:
    """What the model sees when ``t`` raised ``exc`` for ``call`` (a cancellation is not a failure: the
    callers let it through)."""
    if isinstance(exc, ToolArgumentsError):
        return _error(call, "InvalidToolArguments", str(exc))
    if isinstance(exc, TimeoutError):
        return _error(call, "ToolTimeout", f"{t.name} took longer than {t.timeout_s} s")
    if isinstance(exc, KernelError):
        return ToolResultBlock(call_id=call.call_id, content=[exc.to_block()], is_error=True)
    return _error(call, type(exc).__name__, str(exc) or repr(exc))


def _error(call: ToolUseBlock, error_type: str, message: str) -> ToolResultBlock:
    block = ErrorBlock(error_type=error_type, message=message, recoverable=True)
    return ToolResultBlock(call_id=call.call_id, content=[block], is_error=True)


class _Batch:
    """The calls of one batch tool in one turn. Each passes its tool middleware (and its approval) on its own,
    as any call does; the tool is invoked once for those that reach it, when every call of the batch has
    either reached it or been answered without it."""

    def __init__(self, step: ToolStep, tool: Tool, ctx: Context, calls: list[ToolUseBlock]) -> None:
        self._step = step
        self._tool = tool
        self._ctx = ctx
        self._waiting = {c.call_id for c in calls}
        self._arrived: list[tuple[ToolUseBlock, BaseModel, asyncio.Future[ToolResultBlock]]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def execute(self, call: ToolUseBlock) -> ToolResultBlock:
        refused = self._step.refusal(call)
        if refused is not None:
            return refused
        try:
            parsed = self._tool.parse(call.arguments)
        except ToolArgumentsError as exc:
            return _failure(call, self._tool, exc)
        future: asyncio.Future[ToolResultBlock] = asyncio.get_running_loop().create_future()
        if self._waiting:
            self._arrived.append((call, parsed, future))
            self.left(call.call_id)
        else:  # the batch has gone (a middleware called call_next again): this call runs as a batch of one
            self._start([(call, parsed, future)])
        return await future

    def left(self, call_id: str) -> None:
        """``call_id`` reached the batch or was answered without it; the last one to do so starts it."""
        if call_id not in self._waiting:
            return
        self._waiting.discard(call_id)
        if not self._waiting and self._arrived:
            self._start(self._arrived)

    def _start(self, arrived: list[tuple[ToolUseBlock, BaseModel, asyncio.Future[ToolResultBlock]]]) -> None:
        self._tasks.append(asyncio.ensure_future(self._invoke(list(arrived))))

    async def _invoke(
        self, arrived: list[tuple[ToolUseBlock, BaseModel, asyncio.Future[ToolResultBlock]]]
    ) -> None:
        try:
            outputs = await self._tool.invoke_batch([parsed for _, parsed, _ in arrived], self._ctx)
        except asyncio.CancelledError:
            for _, _, future in arrived:
                future.cancel()
            raise
        except CancellationError as exc:
            for _, _, future in arrived:
                if not future.done():
                    future.set_exception(exc)
            return
        except Exception as exc:
            results = [_failure(call, self._tool, exc) for call, _, _ in arrived]
        else:
            results = [_answer(call, value) for (call, _, _), value in zip(arrived, outputs, strict=True)]
        for (_, _, future), result in zip(arrived, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def close(self) -> None:
        """Stop an invocation nobody waits for any more (the step failed or was cancelled)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _all(calls: list[Coroutine[Any, Any, ToolResultBlock]]) -> list[ToolResultBlock]:
    """The calls' results, run concurrently; the first failure cancels the others (their effects must stop
    with the handling that fails) and is raised as it is, not as a group."""
    if not calls:
        return []
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        failed = next(
            (t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None), None
        )
        if failed is not None or not all(t.done() for t in tasks):
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if failed is not None:
        error = failed.exception()
        assert error is not None
        raise error
    return [t.result() for t in tasks]
