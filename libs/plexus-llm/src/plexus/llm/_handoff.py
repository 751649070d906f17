"""Handoffs: an `LLMAgent` hands its conversation to another agent, whose answer becomes its reply.

``LLMAgent(handoffs=["billing", AgentId(...), Handoff(...)])`` offers the model one ``transfer_to_<name>``
tool per target. When the model calls one, the handoff step (in place of the turn's tool step, journaled the
same way) spawns the target as a child run of the same tree (``ctx.spawn``: same budgets, the dashboard's
tree) with the conversation so far in one `DataBlock` (``{HANDOFF_KEY: {"from": ..., "items": [...]}}``,
optionally passed through the handoff's ``input_filter``). An `LLMAgent` receiving that block continues
from those items instead of its own history. The target's answer is the handing-off agent's reply: its loop
ends without another model call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from plexus.core import (
    AgentId,
    AgentNotFoundError,
    AgentStep,
    BaseBlock,
    DataBlock,
    ErrorBlock,
    Item,
    ItemKind,
    JsonValue,
    KernelError,
    RunToolCalled,
    RunToolResult,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from plexus.runtime import AgentType, Context

from ._client import ToolSpec
from ._journal import Journal
from ._memo import transcript_json
from ._tools import ToolRegistry

__all__ = [
    "HANDOFF_KEY",
    "Handoff",
    "HandoffInputError",
    "HandoffTarget",
    "Handoffs",
    "handed_back",
    "handed_over",
    "without_tool_calls",
]

#: The key of the DataBlock that carries a conversation to its target, and, on the handing-off agent's
#: tool result and reply blocks, the metadata key naming the agent that answered.
HANDOFF_KEY = "plexus.llm.handoff"

#: ``input_filter``: the conversation as it would cross -> what the target receives.
InputFilter = Callable[[list[Item]], Sequence[Item]]

_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
_EMPTY_ARGUMENTS: dict[str, JsonValue] = {"type": "object", "properties": {}, "additionalProperties": False}


class RemoteAgent(Protocol):
    """A handoff target outside the cluster (`A2AAgent`): it answers the conversation itself."""

    url: str

    async def hand_over(self, ctx: Context, items: Sequence[Item], call_id: str) -> list[BaseBlock]: ...


@runtime_checkable
class SupportsHandoff(Protocol):
    """What ``handoffs=[...]`` takes besides names and ids: something that makes its own `Handoff`."""

    def as_handoff(self) -> Handoff: ...


class HandoffInputError(KernelError):
    """A handoff's DataBlock whose items are not a conversation (``problem`` says what is wrong)."""

    fields = ("message", "problem")

    def __init__(self, message: str, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem


@dataclass(frozen=True)
class Handoff:
    """One handoff target. ``target``: an agent type's name (a fresh agent per handoff, keyed by the
    message and step) or an `AgentId` (that agent: its conversation becomes the one handed over).
    ``description`` tells the model when to hand off (default: the registered type's description, when the
    target was given as the `AgentType` that ``App.register`` returned). ``tool_name`` defaults to
    ``transfer_to_<type>``; ``input_filter`` maps the items that would cross to those that do."""

    target: AgentId | str
    description: str = ""
    tool_name: str = ""
    input_filter: InputFilter | None = None
    timeout_s: float = 300.0
    #: A remote agent (`A2AAgent`) that answers in place of a spawned one; ``target`` is then its name.
    remote: RemoteAgent | None = None

    def __post_init__(self) -> None:
        name = self.target.type if isinstance(self.target, AgentId) else self.target
        if not isinstance(name, str) or not name:
            raise TypeError(f"a handoff target is an agent type name or an AgentId, got {self.target!r}")
        AgentId(name, "k")  # the type's naming rules, as a ValueError naming the problem
        if not self.tool_name:
            object.__setattr__(self, "tool_name", "transfer_to_" + _TOOL_NAME.sub("_", name)[:52])
        if not self.description:
            object.__setattr__(self, "description", f"Hand the conversation over to the {name} agent.")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.tool_name, self.description, dict(_EMPTY_ARGUMENTS))

    def agent_id(self, ctx: Context) -> AgentId:
        """The agent that receives the conversation: for a type name, that type's agent of the same key as
        the one handing off (``triage/alice`` hands ``billing/alice`` the conversation). One specialist per
        conversation, not a new durable agent (a checkpoint and an EventLog nobody reclaims) per handoff;
        the same agent when a retried handler spawns it again."""
        if isinstance(self.target, AgentId):
            return self.target
        return AgentId(self.target, ctx.agent_id.key, ctx.agent_id.namespace)


HandoffTarget = Handoff | AgentId | AgentType | str | SupportsHandoff


def _handoff(target: HandoffTarget) -> Handoff:
    if isinstance(target, Handoff):
        return target
    if isinstance(target, AgentType):
        return Handoff(target.name, description=target.description)
    if isinstance(target, AgentId | str):
        return Handoff(target)
    if isinstance(target, SupportsHandoff):
        return target.as_handoff()
    raise TypeError(
        f"handoffs takes agent type names, AgentIds, AgentTypes or Handoff(...) values, got {target!r}"
    )


class Handoffs:
    """An agent's handoffs by tool name; a name taken twice, or by one of its tools, is refused."""

    def __init__(self, targets: Sequence[HandoffTarget], tools: ToolRegistry) -> None:
        self._by_name: dict[str, Handoff] = {}
        for target in targets:
            handoff = _handoff(target)
            name = handoff.tool_name
            if name in self._by_name or tools.get(name) is not None:
                raise ValueError(f"handoff tool {name!r} is already a tool or handoff of this agent")
            self._by_name[name] = handoff
        self.specs = [h.spec for h in self._by_name.values()]

    def get(self, name: str) -> Handoff | None:
        return self._by_name.get(name)

    def called(self, calls: Sequence[ToolUseBlock]) -> bool:
        """Whether the model asked for a handoff in this turn."""
        return any(c.tool_name in self._by_name for c in calls)

    async def step(
        self,
        ctx: Context,
        items: list[Item],
        calls: list[ToolUseBlock],
        journal: Journal | None,
        step: int,
    ) -> Item:
        """The handoff step of a turn (``items`` ends with it): the TOOL item answering every call.

        The first handoff call wins; the turn's other calls do not run (an error result each says so).
        A target type nobody registered is an error result naming the known types: the loop goes on."""
        done = journal.replayed(step) if journal is not None else None
        if done is not None:
            return done.item  # the target answered before a crash: not spawned again
        if journal is not None:
            await journal.settle()  # a child run starts only from a stored turn
        chosen = next(c for c in calls if c.tool_name in self._by_name)
        handoff = self._by_name[chosen.tool_name]
        target: AgentId | str = handoff.agent_id(ctx) if handoff.remote is None else handoff.remote.url
        others = {
            c.call_id: _not_run(c, chosen, str(target), c.tool_name in self._by_name)
            for c in calls
            if c is not chosen
        }
        moved = ToolResultBlock(call_id=chosen.call_id, content=[TextBlock(text=f"Transferred to {target}.")])
        passed = [
            *items,
            Item(kind=ItemKind.TOOL, blocks=_in_order(calls, {**others, chosen.call_id: moved})),
        ]
        if handoff.input_filter is not None:
            passed = list(handoff.input_filter(passed))
            if not all(isinstance(i, Item) for i in passed):
                raise TypeError(f"the input_filter of {handoff.tool_name} must return Items")
        run_id = ctx.run_id or ctx.message_id
        ctx.record(
            RunToolCalled(
                run_id=run_id,
                agent_id=str(ctx.agent_id),
                call_id=chosen.call_id,
                tool_name=chosen.tool_name,
                arguments=chosen.arguments,
            )
        )
        await ctx.emit_progress(
            AgentStep.HANDOFF, [chosen], metadata={"from": str(ctx.agent_id), "to": str(target)}
        )
        try:
            if handoff.remote is not None:
                answer = await handoff.remote.hand_over(ctx, passed, chosen.call_id)
            else:
                assert isinstance(target, AgentId)
                block = handoff_block(ctx.agent_id, passed)
                answer = await ctx.spawn(target, [block], timeout=handoff.timeout_s)
        except AgentNotFoundError as exc:
            if exc.agent_id != str(target):
                raise  # the target ran and failed on a send of its own: its failure, as any other
            # No such target: the model may pick another.
            result = ToolResultBlock(call_id=chosen.call_id, content=[exc.to_block()], is_error=True)
        except KernelError as exc:
            if handoff.remote is None:
                raise
            # A remote agent that failed, went away or asks for input: the model sees it and goes on.
            result = ToolResultBlock(call_id=chosen.call_id, content=[exc.to_block()], is_error=True)
        else:
            result = ToolResultBlock(
                call_id=chosen.call_id,
                content=list(answer) or [TextBlock(text="")],
                terminate=True,
                metadata={HANDOFF_KEY: str(target)},
            )
        error = next((b for b in result.content if isinstance(b, ErrorBlock)), None)
        ctx.record(
            RunToolResult(
                run_id=run_id,
                agent_id=str(ctx.agent_id),
                call_id=chosen.call_id,
                tool_name=chosen.tool_name,
                output=None if error else [b.model_dump(mode="json") for b in result.content],
                error=None if error is None else {"error_type": error.error_type, "message": error.message},
            )
        )
        await ctx.emit_progress(AgentStep.TOOL_RESULT, [result])
        item = Item(kind=ItemKind.TOOL, blocks=_in_order(calls, {**others, chosen.call_id: result}))
        if journal is not None:
            await journal.append(step, item)
        return item


def _in_order(calls: Sequence[ToolUseBlock], results: dict[str, ToolResultBlock]) -> list[BaseBlock]:
    return [results[c.call_id] for c in calls]


def _not_run(call: ToolUseBlock, chosen: ToolUseBlock, target: str, handoff: bool) -> ToolResultBlock:
    if handoff:
        kind, why = "HandoffIgnored", f"only the first handoff of a turn is taken ({chosen.tool_name})"
    else:
        kind, why = "ToolNotRun", "a handoff in the same turn took the conversation"
    text = f"{why}: the conversation went to {target}"
    block = ErrorBlock(error_type=kind, message=text, recoverable=False)
    return ToolResultBlock(call_id=call.call_id, content=[block], is_error=True)


def handoff_block(source: AgentId, items: Sequence[Item]) -> DataBlock:
    """The message that carries ``items`` to a handoff's target."""
    payload: dict[str, JsonValue] = {"from": str(source), "items": list(transcript_json(items))}
    return DataBlock(data={HANDOFF_KEY: payload})


def handed_over(blocks: Sequence[BaseBlock]) -> list[Item] | None:
    """The conversation a handoff carried in ``blocks``, or None when they are an ordinary message."""
    if len(blocks) != 1 or not isinstance(blocks[0], DataBlock):
        return None
    payload = blocks[0].data.get(HANDOFF_KEY)
    if payload is None:
        return None
    raw = payload.get("items") if isinstance(payload, dict) else None
    if not isinstance(raw, list):
        raise HandoffInputError("a handoff's DataBlock must hold its conversation as a list", "no items")
    try:
        return [Item.model_validate(d) for d in raw]
    except ValidationError as exc:
        raise HandoffInputError(f"a handoff's conversation is not a list of items: {exc}", str(exc)) from None


def handed_back(tool_item: Item) -> Item | None:
    """The target's answer in a handoff step's item (the reply of the agent that handed off), else None."""
    for block in tool_item.blocks:
        if isinstance(block, ToolResultBlock) and block.terminate and HANDOFF_KEY in block.metadata:
            by: Any = block.metadata[HANDOFF_KEY]
            answer = [
                b.model_copy(update={"metadata": {**b.metadata, HANDOFF_KEY: by}}) for b in block.content
            ]
            return Item(kind=ItemKind.ASSISTANT, blocks=answer)
    return None


def without_tool_calls(items: list[Item]) -> list[Item]:
    """An ``input_filter``: the conversation without tool calls and results (the target sees the words)."""
    kept: list[Item] = []
    for item in items:
        if item.kind is ItemKind.TOOL:
            continue
        blocks = [b for b in item.blocks if not isinstance(b, ToolUseBlock | ToolResultBlock)]
        if blocks:
            kept.append(item.model_copy(update={"blocks": blocks}))
    return kept
