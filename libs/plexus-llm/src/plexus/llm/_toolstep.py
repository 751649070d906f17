"""One turn's tool step: the model's tool calls run (parallel, sequential or batched, as each tool says) and
answered, every failure as an ErrorBlock the model sees.

`ToolStep` runs the calls of one turn through the tool middleware, records ``RunToolCalled`` and
``RunToolResult``, and emits the ``tool_call`` / ``tool_result`` progress steps; `LLMAgent` journals
its result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

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
from ._tools import ToolArgumentsError, ToolRegistry, tool_output_blocks

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
        parallel = [c for c in calls if modes[c.call_id] == "parallel"]
        sequential = [c for c in calls if modes[c.call_id] == "sequential"]
        batches: dict[str, list[ToolUseBlock]] = {}
        for c in calls:
            if modes[c.call_id] == "batch":
                batches.setdefault(c.tool_name, []).append(c)
        for name, batch in batches.items():
            results.update(await self._batch(ctx, name, batch))
        if len(parallel) == 1:  # the common case: no task of its own to wait for
            outcomes = [await self._call(ctx, parallel[0])]
        else:
            outcomes = await asyncio.gather(*(self._call(ctx, c) for c in parallel))
        results.update({c.call_id: r for c, r in zip(parallel, outcomes, strict=True)})
        for call in sequential:
            await ctx.check(max_age=self.check_max_age)
            results[call.call_id] = await self._call(ctx, call)
        return Item(kind=ItemKind.TOOL, blocks=[results[c.call_id] for c in calls])

    async def _batch(self, ctx: Context, name: str, calls: list[ToolUseBlock]) -> dict[str, ToolResultBlock]:
        """All calls of one batch tool in one invocation; a call with bad arguments is answered on its own."""
        t = self.tools.get(name)
        assert t is not None
        results: dict[str, ToolResultBlock] = {}
        valid: list[tuple[ToolUseBlock, Any]] = []
        for call in calls:
            await ctx.emit_progress(AgentStep.TOOL_CALL, [call])
            if call.metadata.get(INVALID_ARGUMENTS_KEY) is not None:
                results[call.call_id] = await self._execute(ctx, call)  # answers with the ErrorBlock
                continue
            try:
                valid.append((call, t.parse(call.arguments)))
            except ToolArgumentsError as exc:
                results[call.call_id] = _error(call, "InvalidToolArguments", str(exc))
        if valid:
            try:
                call_ = t.invoke_batch([parsed for _, parsed in valid], ctx)
                outputs = await (asyncio.wait_for(call_, t.timeout_s) if t.timeout_s else call_)
            except (CancellationError, asyncio.CancelledError):
                raise
            except Exception as exc:
                for call, _ in valid:
                    results[call.call_id] = _error(call, type(exc).__name__, str(exc) or repr(exc))
            else:
                for (call, _), value in zip(valid, outputs, strict=True):
                    results[call.call_id] = ToolResultBlock(
                        call_id=call.call_id, content=tool_output_blocks(value)
                    )
        for call in calls:
            await ctx.emit_progress(AgentStep.TOOL_RESULT, [results[call.call_id]])
        return results

    async def _call(self, ctx: Context, call: ToolUseBlock) -> ToolResultBlock:
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
            return await self._execute(context.ctx, context.call)

        result: ToolResultBlock = await chain("tool", self.middleware, execute)(ToolCall(ctx, call))
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

    async def _execute(self, ctx: Context, call: ToolUseBlock) -> ToolResultBlock:
        """Run one call; every failure becomes an ErrorBlock the model sees, never a crash of the loop."""
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
        try:
            value = await t.invoke(call.arguments, ctx)
        except ToolArgumentsError as exc:
            return _error(call, "InvalidToolArguments", str(exc))
        except TimeoutError:
            return _error(call, "ToolTimeout", f"{t.name} took longer than {t.timeout_s} s")
        except (CancellationError, asyncio.CancelledError):
            raise
        except KernelError as exc:
            return ToolResultBlock(call_id=call.call_id, content=[exc.to_block()], is_error=True)
        except Exception as exc:
            return _error(call, type(exc).__name__, str(exc) or repr(exc))
        if isinstance(value, ToolResultBlock):
            return value.model_copy(update={"call_id": call.call_id})
        return ToolResultBlock(call_id=call.call_id, content=tool_output_blocks(value))


def _problem(invalid: JsonValue) -> str:
    if isinstance(invalid, dict):
        return f"{invalid.get('problem')}; raw arguments: {invalid.get('raw')!s:.500}"
    return str(invalid)


def _error(call: ToolUseBlock, error_type: str, message: str) -> ToolResultBlock:
    block = ErrorBlock(error_type=error_type, message=message, recoverable=True)
    return ToolResultBlock(call_id=call.call_id, content=[block], is_error=True)
