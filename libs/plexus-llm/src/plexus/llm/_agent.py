"""`LLMAgent`: the model/tool loop as a durable Plexus agent, journaled so a crash never re-pays a turn.

One handled message runs the loop: transcript → model turn (streamed: deltas on the agent's stream subject)
→ tool calls → tool results → the seed 002 FinishReason table. Every completed step goes to the journal
(`_journal.py`) before the loop acts on it (a tool, the next model call, the end) and usage goes through
``ctx.usage()`` after every model call, so the orchestrator's tree budget stops a runaway tree on any worker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from plexus.core import (
    AgentStep,
    BaseBlock,
    DataBlock,
    FinishReasonKind,
    Item,
    ItemKind,
    JsonValue,
    RunLlmCall,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from plexus.runtime import Agent, Context

from ._accumulate import ModelTurn
from ._agent_setup import check_limits, check_settings, middleware_stages
from ._approvals import (
    PENDING_KEY,
    ApprovalPendingError,
    NoPendingApprovalError,
    approval_of,
    check_decision,
    suspension_id,
)
from ._client import ModelClient, ModelRequest
from ._compaction import CompactionPipeline
from ._conversation import TRANSCRIPT_KEY, Conversation, check_size
from ._decided import record_decision
from ._errors import ProviderError
from ._fork import FORK_KEY, apply_fork, forked
from ._genai import GenAITelemetry
from ._handoff import Handoffs, HandoffTarget, handed_back, handed_over
from ._journal import JOURNAL_SEQ_KEY, Journal, collect_outcome
from ._middleware import MessageCall, Middleware, ModelCall, ProviderRetry, Turn, chain
from ._modelturn import race_cancellation, stream_turn
from ._output import StructuredOutput
from ._settings import ModelSettings
from ._tools import Tool, ToolRegistry
from ._toolsource import ToolSource, ToolSources, split_sources
from ._toolstep import ToolStep

__all__ = ["FINISH_KEY", "TRANSCRIPT_KEY", "LLMAgent", "ModelFinishedWithError"]

log = logging.getLogger("plexus.llm")

#: Metadata key on the reply's blocks: why the loop stopped (a FinishReasonKind value or ``max_turns``).
FINISH_KEY = "plexus.llm.finish"


#: `LLMAgent`'s default ``provider_retry``: three calls, 0.5 s then 1 s apart (or the provider's
#: ``retry-after``, at most 30 s).
_DEFAULT_PROVIDER_RETRY = ProviderRetry()
#: `LLMAgent`'s default ``telemetry``: GenAI spans while traced, content only when the environment opts in.
_DEFAULT_TELEMETRY = GenAITelemetry()


class ModelFinishedWithError(ProviderError):
    """The model ended its turn with finish reason ``error`` (seed 002: return the error to the host)."""


class LLMAgent(Agent):
    """The loop as an agent type: ``app.register("assistant", lambda _id: LLMAgent(model, tools=[...]))``.

    The conversation is kept in the agent's state, so it survives restarts and moves between workers.
    ``journal=False`` turns off the per-step journal (a stateless demo, or a model that costs nothing).
    ``check_max_age``: before each step the loop checks the run tree (`Context.check`); a model call or
    tool step may start on the tree's budget as verified at most this many seconds ago (by the last
    ``ctx.usage()`` after a model call, or a check) instead of reading it again; 0 reads it every time.
    Cancellation and preemption are always as known now. ``max_transcript_bytes``: before each model call the
    transcript's JSON must be at most this large (`TranscriptTooLargeError` otherwise, no call made): the
    state holding it is stored in one NATS message (1 MiB by default); None turns the check off.
    ``provider_retry``: retries of a model call on a 429 or 5xx, in the handler (`ProviderRetry`; the
    adapters turn the SDK's own retries off); left out when ``middleware`` has a `ProviderRetry` of its
    own, None for none. Once it gives up, the error is the run's RetryPolicy's to retry (docs/llm.md).
    ``settings``: `ModelSettings` sent with every model call (its ``max_tokens``/``temperature`` win over the
    arguments); a model middleware overrides them per call (``context.with_settings``). The model's adapter
    refuses here what its provider cannot honour (`UnsupportedSettingError`).
    ``output_type``: a pydantic model the final answer is validated into (`_output.py`); the reply is then one
    `DataBlock` of it; an answer that does not validate is fed back ``output_retries`` times, then the message
    fails with `OutputValidationError`.
    ``handoffs``: agents the model may hand the conversation to (``transfer_to_<name>`` tools; `Handoff`).
    ``telemetry``: OpenTelemetry GenAI spans and metrics (`GenAITelemetry`, innermost at the message, model
    and tool stages); left out when ``middleware`` has one of its own, None for none.
    """

    def __init__(
        self,
        model: ModelClient,
        *,
        system: str = "",
        tools: Sequence[Tool | ToolSource] = (),
        max_turns: int = 10,
        max_tokens: int = 1024,
        temperature: float | None = None,
        journal: bool = True,
        compaction: CompactionPipeline | None = None,
        middleware: Sequence[Middleware] = (),
        provider_retry: ProviderRetry | None = _DEFAULT_PROVIDER_RETRY,
        check_max_age: float = 0.5,
        max_transcript_bytes: int | None = 512 * 1024,
        settings: ModelSettings | None = None,
        output_type: type[BaseModel] | None = None,
        output_retries: int = 1,
        handoffs: Sequence[HandoffTarget] = (),
        telemetry: GenAITelemetry | None = _DEFAULT_TELEMETRY,
    ) -> None:
        super().__init__()
        check_limits(max_turns, check_max_age, max_transcript_bytes)
        self.max_transcript_bytes = max_transcript_bytes
        self.check_max_age = check_max_age
        self.model = model
        self.system = system
        plain, sources = split_sources(tools)
        self.tools = ToolRegistry(plain)
        #: Tool sources (MCP servers) listed before each step; None keeps the steps free of that work.
        self._tool_sources = ToolSources(plain, sources) if sources else None
        #: ``transfer_to_<name>`` tools (`_handoff.py`); None: no handoff work on any turn.
        self.handoffs = Handoffs(handoffs, self.tools) if handoffs else None
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.settings = settings if settings is not None else ModelSettings()
        self._check_settings()
        #: The typed answer asked for; None: no output work on any turn.
        self._output = StructuredOutput(output_type, output_retries, self.tools) if output_type else None
        self._output_spec = self._output.spec if self._output is not None else None
        self.journal_enabled = journal
        self.compaction = compaction
        self.middleware = list(middleware)
        self._model_middleware, self._tool_middleware, self._message_middleware = middleware_stages(
            self.middleware, provider_retry, telemetry
        )
        #: Decisions on approval-gated calls while a resumed tool step runs (call id -> decision).
        self._decisions: dict[str, dict[str, Any]] = {}
        #: Where this activation saw the journal end after its last completed message (None: unknown).
        self._journal_end: int | None = None
        self._message_usage = Usage()  # the current message's model usage (progress metadata)
        self._conversation = Conversation()
        self._system: list[Item] = []
        self._journal: Journal | None = None  # the current message's journal
        #: A journal write a failed handling left in flight: the next handling waits for it to end first,
        #: or its journal read could miss it (and its first append conflict with it).
        self._abandoned: asyncio.Future[int] | None = None

    # -- the loop -------------------------------------------------------------------------------------
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        try:
            handle = chain("message", self._message_middleware, self._handle_call)
            reply: list[BaseBlock] | None = await handle(MessageCall(ctx, blocks, self))
            return reply
        except BaseException:
            # A failed handling may have journaled steps: the next one must read the journal back.
            self._journal_end = None
            if self._journal is not None:
                self._abandoned = self._journal.abandon()
            raise
        finally:
            self._journal = None

    async def _handle_call(self, call: MessageCall) -> list[BaseBlock]:
        return await self._handle(call.blocks, call.ctx)

    async def _handle(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self._message_usage = Usage()
        if FORK_KEY in self.state:  # a fork's edited system prompt and settings (`_fork.py`)
            apply_fork(self)
        journal = self._journal = await self._open(ctx)
        if self._tool_sources is not None:
            self.tools = await self._tool_sources.registry()
        history = self._conversation.history(self.state)
        decision = approval_of(blocks)
        pending = self.state.get(PENDING_KEY)
        step = 0
        resumed_turn: Item | None = None  # the suspended model turn whose tool step a decision resumes
        terminated = False
        if pending is not None:
            if decision is None:
                calls = list(pending["calls"])
                raise ApprovalPendingError(f"awaiting approval of tool calls {calls}", calls)
            check_decision(pending, decision)  # its call, its suspension, not decided yet
            record_decision(ctx, decision)  # who decided, committed with this message
            pending["decisions"][decision["call_id"]] = decision
            if set(pending["decisions"]) != set(pending["calls"]):
                undecided = [c for c in pending["calls"] if c not in pending["decisions"]]
                ctx.await_approval(undecided, suspension=pending.get("suspension"))
                return _awaiting(pending, history[-1].blocks)
            # Every pending call is decided: run the tool step of the suspended turn, then go on.
            calls_made = [b for b in history[-1].blocks if isinstance(b, ToolUseBlock)]
            self._decisions = dict(pending["decisions"])
            try:
                resumed = await self._tool_step(ctx, calls_made, journal, step)
                if journal is not None:
                    await journal.settle()  # stored before the state forgets the pending calls
            finally:
                self._decisions = {}
            del self.state[PENDING_KEY]
            step += 1
            items = [*history, resumed]
            resumed_turn = history[-1]
            terminated = _terminates(resumed)
        elif decision is not None:
            raise NoPendingApprovalError(
                f"call {decision['call_id']!r} awaits no approval", decision["call_id"]
            )
        else:
            # A handoff's message carries the conversation to continue from, in place of this agent's own.
            handed = handed_over(blocks)
            if handed is None:
                handed = forked(self, blocks)  # a fork continues from the items it carries, too
            items = (
                handed if handed is not None else [*history, Item(kind=ItemKind.USER, blocks=list(blocks))]
            )
        turns = 0
        finish = "max_turns"
        attempt = self._output.attempt() if self._output is not None else None
        last: ModelTurn | None = None
        if terminated:  # the resumed tool step ended the run: no follow-up call, as on the loop's own path
            finish = "terminated"
        for _ in range(0 if terminated else self.max_turns):
            await ctx.check(max_age=self.check_max_age)
            if self.compaction is not None:
                # Deterministic strategies give the same result when a crash-retried handler replays.
                last_input = last.usage.input_tokens if last is not None else None
                items = await self.compaction.run(items, last_input, model=self.model, request=self._request)
            check_size(items, self.max_transcript_bytes)
            outcome: list[ModelTurn | Item] = []
            iteration = functools.partial(self._iteration, journal=journal, step=step, outcome=outcome)
            await chain("turn", self.middleware, iteration)(Turn(ctx, tuple(items), turns))
            if not outcome:
                raise RuntimeError(
                    "a turn middleware returned without calling call_next: a turn cannot be skipped "
                    "(raise MiddlewareTermination to end the run)"
                )
            turns += 1
            turn = outcome[0]
            assert isinstance(turn, ModelTurn)
            step += 1
            items.append(turn.item)
            last = turn
            kind = turn.finish_reason.kind
            if attempt is not None and (verdict := attempt.judge(turn)) is not None:
                items.extend(verdict.items)  # a pure function of the turn: replayed turns give it again
                if attempt.value is None:
                    continue  # the model was told what did not validate: it answers again
                finish = FinishReasonKind.COMPLETED.value
                break
            if (
                len(outcome) == 1
                and kind is FinishReasonKind.TOOL_CALL
                and self._needs_approval(turn.tool_calls)
            ):
                return await self._suspend(ctx, items, journal, turn, step)
            if len(outcome) == 2:
                tool_item = outcome[1]
                assert isinstance(tool_item, Item)
                step += 1
                items.append(tool_item)
                if _terminates(tool_item):
                    finish = "terminated"
                    break
                continue
            if kind is FinishReasonKind.TOOL_CALL:
                continue  # e.g. Anthropic pause_turn: send the turn back and let the model go on
            if kind is FinishReasonKind.ERROR:
                raise ModelFinishedWithError(f"model ended with an error ({turn.finish_reason.raw})", "", 0)
            if kind is FinishReasonKind.OTHER:
                log.warning("unknown finish reason %r treated as completed", turn.finish_reason.raw)
            finish = kind.value
            break
        answer = handed_back(items[-1]) if finish == "terminated" and self.handoffs is not None else None
        if answer is not None:
            finish = "handoff"  # the target's answer is the reply
        # Every step stored before the state takes the transcript: a failed append leaves the state as it was.
        end = await journal.settle() if journal is not None else None
        self._conversation.keep(self.state, items)
        if end is not None:
            self.state[JOURNAL_SEQ_KEY] = self._journal_end = end
        await ctx.emit_progress(
            AgentStep.DONE, metadata={"finish": finish, "steps": step, "usage": self._usage_meta()}
        )
        if attempt is not None and attempt.value is not None:
            return attempt.reply({FINISH_KEY: finish})
        return _reply(answer or (last.item if last is not None else resumed_turn), finish)

    async def _open(self, ctx: Context) -> Journal | None:
        """Check the run tree and open the message's journal: the two reads go out together."""
        if not self.journal_enabled:
            await ctx.check()
            return None
        abandoned, self._abandoned = self._abandoned, None
        if abandoned is not None:
            await asyncio.wait({abandoned})  # its outcome does not matter, only that it is over
        checked = asyncio.ensure_future(ctx.check())
        try:
            journal = await Journal.open(ctx, self.state, known_end=self._journal_end)
        except BaseException:
            checked.cancel()
            checked.add_done_callback(collect_outcome)
            raise
        self._journal_end = None
        await checked  # the first step needs no check of its own now (check_max_age)
        return journal

    def _check_settings(self) -> None:
        """Refuse, now, settings the model cannot honour (`check_settings`; a fork's too, `_fork.py`)."""
        check_settings(
            self.model, self.settings, self.tools, self.handoffs, self.max_tokens, self.temperature
        )

    def _usage_meta(self) -> dict[str, Any]:
        """This message's model usage so far, for progress events: viewers show it per agent, live."""
        u = self._message_usage
        meta: dict[str, Any] = {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cached_tokens": u.cached_tokens,
            "reasoning_tokens": u.reasoning_tokens,
        }
        if u.cost is not None:
            meta["cost"] = u.cost.model_dump(mode="json")
        return meta

    def _needs_approval(self, calls: list[ToolUseBlock]) -> list[str]:
        if self.handoffs is not None and self.handoffs.called(calls):
            return []  # the handoff takes the turn: its other calls do not run, so nothing awaits approval
        return [
            c.call_id for c in calls if (t := self.tools.get(c.tool_name)) is not None and t.needs_approval
        ]

    async def _suspend(
        self, ctx: Context, items: list[Item], journal: Journal | None, turn: ModelTurn, step: int
    ) -> list[BaseBlock]:
        """Park the loop before the tool step: the state (checkpointed by the runtime) holds it all."""
        calls = self._needs_approval(turn.tool_calls)
        suspension = suspension_id(ctx.message_id, len(items))  # call ids recur: decisions name this one
        pending: dict[str, Any] = {"calls": calls, "decisions": {}, "suspension": suspension}
        end = await journal.settle() if journal is not None else None  # stored before the state parks
        self.state[PENDING_KEY] = pending
        self._conversation.keep(self.state, items)
        if end is not None:
            self.state[JOURNAL_SEQ_KEY] = self._journal_end = end
        waiting = [c for c in turn.tool_calls if c.call_id in calls]
        await ctx.emit_progress(
            AgentStep.PAUSED,
            waiting,
            metadata={"awaiting_approval": calls, "steps": step, "usage": self._usage_meta()},
        )
        # An orchestrated run waits (status awaiting_approval), not completes; in this suspension (ids recur).
        ctx.await_approval(calls, suspension=suspension)
        return _awaiting(pending, waiting)

    async def _iteration(
        self, turn: Turn, *, journal: Journal | None, step: int, outcome: list[ModelTurn | Item]
    ) -> None:
        """One model call and, when it asks for tools, the tool step; results go to ``outcome`` (a turn
        middleware calling ``call_next`` again runs the iteration again: the last run counts)."""
        outcome.clear()
        if self._tool_sources is not None:  # a server may have changed its list since the last step
            self.tools = await self._tool_sources.registry()
        model_turn = await self._model_step(turn.ctx, list(turn.items), journal, step)
        outcome.append(model_turn)
        calls = model_turn.tool_calls
        if (
            model_turn.finish_reason.kind is FinishReasonKind.TOOL_CALL
            and calls
            and not self._needs_approval(calls)
            and (self._output is None or not self._output.claims(calls))
        ):
            # Right after a model call its ctx.usage() verified the tree's budget: no second read.
            await turn.ctx.check(max_age=self.check_max_age)
            if self.handoffs is not None and self.handoffs.called(calls):
                items = [*turn.items, model_turn.item]
                outcome.append(await self.handoffs.step(turn.ctx, items, calls, journal, step + 1))
                return
            outcome.append(await self._tool_step(turn.ctx, model_turn.tool_calls, journal, step + 1))

    def _request(self, items: Sequence[Item]) -> ModelRequest:
        """The model request of ``items``: the system prompt, the tools on offer and the settings added."""
        return ModelRequest(
            items=[*self._system_items(), *items],
            tools=self.tools.specs if self.handoffs is None else [*self.tools.specs, *self.handoffs.specs],
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            settings=self.settings,
            output=self._output_spec,
        )

    async def _model_step(
        self, ctx: Context, items: list[Item], journal: Journal | None, step: int
    ) -> ModelTurn:
        done = journal.replayed(step) if journal is not None else None
        if done is not None and done.finish_reason is not None:
            # Already paid for (and already counted against the budget) before the crash.
            self._message_usage = self._message_usage + (done.usage or Usage())
            return ModelTurn(done.item, done.usage or Usage(), done.finish_reason)
        await ctx.emit_progress(AgentStep.THINKING, metadata={"step": step, "usage": self._usage_meta()})
        request = self._request(items)
        started = time.monotonic()

        async def call_model(call: ModelCall) -> ModelTurn:
            return await race_cancellation(ctx, stream_turn(ctx, self.model, call.request))

        call = chain("model", self._model_middleware, call_model)
        if journal is not None:
            await journal.settle()  # a model call follows only stored steps: no crash pays for one twice
        turn: ModelTurn = await call(ModelCall(ctx, request, self.model.model, self.model))
        run_id = ctx.run_id or ctx.message_id
        ctx.record(
            RunLlmCall(
                run_id=run_id,
                agent_id=str(ctx.agent_id),
                model=self.model.model,
                usage=turn.usage,
                finish_reason=turn.finish_reason,
                duration_s=time.monotonic() - started,
            )
        )
        self._message_usage = self._message_usage + turn.usage
        # Counted before it is journaled: a replayed turn is never counted again, so a journaled turn must
        # have been (a crash between the two re-pays the call and counts it again: two real calls).
        await ctx.usage(turn.usage, turns=1)  # may raise BudgetExhaustedError: the tree's budget is spent
        if journal is not None:
            await journal.append(step, turn.item, turn.usage, turn.finish_reason)
        return turn

    def _system_items(self) -> list[Item]:
        """The system prompt's item: one object while the prompt stays (its conversion is kept with it)."""
        if not self.system:
            return []
        if not self._system or self._system[0].text != self.system:
            self._system = [Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text=self.system)])]
        return self._system

    async def _tool_step(
        self, ctx: Context, calls: list[ToolUseBlock], journal: Journal | None, step: int
    ) -> Item:
        done = journal.replayed(step) if journal is not None else None
        if done is not None:
            return done.item
        if journal is not None:
            await journal.settle()  # tools act only on a stored turn (never on one a retry asks again)
        runner = ToolStep(self.tools, self._tool_middleware, self.check_max_age, self._decisions)
        item = await runner.run(ctx, calls)
        if journal is not None:
            await journal.append(step, item)
        return item


def _awaiting(pending: dict[str, Any], made: Sequence[BaseBlock]) -> list[BaseBlock]:
    """The suspended reply: the undecided call ids and, as `ApprovalRequired.calls`, what each call asks."""
    waiting = [c for c in pending["calls"] if c not in pending["decisions"]]
    suspension: JsonValue = pending.get("suspension")
    calls: list[JsonValue] = [
        {"call_id": b.call_id, "tool_name": b.tool_name, "arguments": b.arguments, "suspension": suspension}
        for b in made
        if isinstance(b, ToolUseBlock) and b.call_id in waiting
    ]
    data: dict[str, JsonValue] = {"status": "awaiting_approval", "call_ids": list(waiting), "calls": calls}
    return [DataBlock(data=data, metadata={FINISH_KEY: "awaiting_approval"})]


def _terminates(tool_item: Item) -> bool:
    """A tool result asked to end the loop (``terminate``): no follow-up model call."""
    return any(isinstance(b, ToolResultBlock) and b.terminate for b in tool_item.blocks)


def _reply(turn: Item | None, finish: str) -> list[BaseBlock]:
    blocks: list[BaseBlock] = []
    if turn is not None:
        blocks = [b for b in turn.blocks if not isinstance(b, ThinkingBlock | ToolUseBlock)]
    if not blocks:
        blocks = [TextBlock(text="")]
    return [b.model_copy(update={"metadata": {**b.metadata, FINISH_KEY: finish}}) for b in blocks]
