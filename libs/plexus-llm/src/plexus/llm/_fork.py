"""Forks of an `LLMAgent` at a turn: the transcript as it was then, from the journal, never asked again.

`Runtime.fork_run` (plexus.runtime) knows nothing of models: it finds the agent, its handled messages and its
states, then asks the fork hooks of the ``plexus.fork`` entry-point group for the new agent's start.
`fork_hook` is the loop's: it claims an agent that has a journal (``<type>.llm-journal/<key>``) or a
transcript in its state, and rebuilds the conversation at the point from the message's journaled steps:

- turn N (1-based) is the N-th journaled model turn of the message, with its tool results (a turn whose
  tools were not run, e.g. one awaiting approval, is not a point);
- the items before the message's first turn are the agent's transcript after the message up to that turn
  (so a typed output's feedback items are kept), or, while the message is still being handled, its
  transcript before the message plus the run's input;
- turn 0 (or none) is the message itself: its user item is replaced by ``edit.message`` when given.

The fork's first message is one `DataBlock` ``{FORK_KEY: {"from", "items", "system", "settings"}}``. An
`LLMAgent` receiving it continues from those items (its own history replaced, as for a handoff), keeps the
edited system prompt and settings in its state for every later message, and calls the model: the steps
before the point are items it was given, never requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import ValidationError

from plexus.core import BaseBlock, DataBlock, FinishReasonKind, Item, ItemKind, JsonValue
from plexus.runtime import ForkPointNotFoundError, InvalidForkError
from plexus.runtime.kernel import ForkSource, ForkStart

from ._approvals import PENDING_KEY
from ._conversation import TRANSCRIPT_KEY
from ._journal import JOURNAL_SEQ_KEY, LlmStep, journal_id
from ._memo import item_json
from ._settings import ModelSettings

__all__ = ["FORK_KEY", "apply_fork", "fork_hook", "forked"]

#: The fork's DataBlock key, and the agent state key of its edited system prompt and settings.
FORK_KEY = "plexus.llm.fork"
#: State keys of the loop that the fork's block replaces or a new agent starts without.
_LOOP_KEYS = (TRANSCRIPT_KEY, JOURNAL_SEQ_KEY, PENDING_KEY)


async def fork_hook(source: ForkSource) -> ForkStart | None:
    """The ``plexus.fork`` entry point: the start of a fork of an LLM agent, None for another agent."""
    journal = [
        r.entry for r in await source.read_log(journal_id(source.agent_id)) if isinstance(r.entry, LlmStep)
    ]
    states = [s for m in source.messages for s in (m.state_before, m.state_after) if s]
    if not journal and not any(TRANSCRIPT_KEY in s for s in states):
        return None
    edit = source.edit
    settings: dict[str, Any] | None = None
    if edit.settings is not None:
        try:
            settings = ModelSettings.model_validate(edit.settings).model_dump(mode="json", exclude_unset=True)
        except ValidationError as exc:
            raise InvalidForkError(f"settings: {exc}") from None
    message_id, before, after = _message(source, journal)
    steps = _steps(journal, message_id)
    turn = source.point.turn or 0
    if source.spawned_at is not None:  # the parent's last turn before the one whose tools spawned the child
        turn = max(0, sum(1 for s in steps if s.finish_reason and s.timestamp <= source.spawned_at) - 1)
    base = _base(source, steps, before, after)
    items = base + _through_turn(source, steps, turn)
    edited = list(edit.message) if edit.message else None
    if edited is not None:
        if turn == 0 and items and items[-1].kind is ItemKind.USER:
            items = items[:-1]  # the message itself, edited
        items.append(Item(kind=ItemKind.USER, blocks=edited))
    fork: dict[str, JsonValue] = {
        "from": str(source.agent_id),
        "items": [item_json(i) for i in items],
        "system": edit.system,
        "settings": settings,
    }
    state = {k: v for k, v in (before or {}).items() if k not in _LOOP_KEYS and k != FORK_KEY}
    if before and FORK_KEY in before and not (edit.system or settings):
        fork["system"], fork["settings"] = before[FORK_KEY].get("system"), before[FORK_KEY].get("settings")
    return ForkStart(blocks=[DataBlock(data={FORK_KEY: fork})], state=state or None, turn=turn)


def _message(
    source: ForkSource, journal: list[LlmStep]
) -> tuple[str | None, dict[str, Any] | None, dict[str, Any] | None]:
    """The message at the point (its id, the state before and after it; None when not recorded)."""
    handled = source.message
    if handled is not None:
        return handled.message_id, handled.state_before, handled.state_after
    # Still being handled: the journal's latest message that the agent's log does not hold yet.
    logged = {m.message_id for m in source.messages}
    pending = [s.message_id for s in journal if s.message_id not in logged]
    last = source.messages[-1].state_after if source.messages else {}
    return (pending[-1] if pending else None), last, None


def _steps(journal: list[LlmStep], message_id: str | None) -> list[LlmStep]:
    """The message's steps in order (a step journaled twice, by a turn run again, counts as its last)."""
    by_step = {s.step: s for s in journal if s.message_id == message_id}
    return [by_step[n] for n in sorted(by_step)]


def _base(
    source: ForkSource, steps: list[LlmStep], before: dict[str, Any] | None, after: dict[str, Any] | None
) -> list[Item]:
    """What the model saw before the message's first turn (the system prompt aside)."""
    if after is not None and steps:
        transcript = after.get(TRANSCRIPT_KEY, [])
        first = item_json(steps[0].item)
        for i, raw in enumerate(transcript):
            if raw == first:
                return [Item.model_validate(d) for d in transcript[:i]]
    if before is None:
        raise _not_found(source, "the agent's transcript before this message is not recorded")
    items = [Item.model_validate(d) for d in before.get(TRANSCRIPT_KEY, [])]
    if source.input and not source.messages[: source.point.message]:
        items.append(Item(kind=ItemKind.USER, blocks=list(source.input)))
    return items


def _through_turn(source: ForkSource, steps: Sequence[LlmStep], turn: int) -> list[Item]:
    """The items of the message's turns 1..``turn`` with their tool results."""
    if turn == 0:
        return []
    turns = [i for i, s in enumerate(steps) if s.finish_reason is not None]
    if turn > len(turns):
        raise _not_found(source, f"turn {turn}: the message has {len(turns)} journaled turn(s)")
    end = turns[turn - 1]
    model = steps[end]
    assert model.finish_reason is not None
    taken = [s.item for s in steps[: end + 1]]
    follows = steps[end + 1] if end + 1 < len(steps) else None
    if follows is not None and follows.finish_reason is None:
        taken.append(follows.item)
    elif model.finish_reason.kind is FinishReasonKind.TOOL_CALL:
        raise _not_found(source, f"turn {turn}: its tool results are not recorded (awaiting approval?)")
    return taken


def _not_found(source: ForkSource, reason: str) -> ForkPointNotFoundError:
    return ForkPointNotFoundError(source.run.run_id, str(source.agent_id), reason)


# -- the agent's side ------------------------------------------------------------------------------------
class _Forked(Protocol):
    """What a fork changes of its `LLMAgent` (a protocol: the agent imports this module)."""

    state: dict[str, Any]
    system: str
    settings: ModelSettings

    def _check_settings(self) -> None: ...


def forked(agent: _Forked, blocks: Sequence[BaseBlock]) -> list[Item] | None:
    """The conversation a fork's block carries (its edits kept in the agent's state), else None."""
    if len(blocks) != 1 or not isinstance(blocks[0], DataBlock):
        return None
    payload = blocks[0].data.get(FORK_KEY)
    if not isinstance(payload, dict):
        return None
    raw = payload.get("items")
    try:
        items = [Item.model_validate(d) for d in raw] if isinstance(raw, list) else None
    except ValidationError as exc:
        raise InvalidForkError(f"a fork's items are not items: {exc}") from None
    if items is None:
        raise InvalidForkError("a fork's DataBlock must hold its conversation as a list of items")
    edits = {k: payload.get(k) for k in ("system", "settings") if payload.get(k) is not None}
    if edits:
        agent.state[FORK_KEY] = edits
        apply_fork(agent)
    return items


def apply_fork(agent: _Forked) -> None:
    """Take the edited system prompt and settings a fork left in the agent's state."""
    edits = agent.state[FORK_KEY]
    if edits.get("system") is not None:
        agent.system = edits["system"]
    if edits.get("settings") is not None:
        try:
            agent.settings = ModelSettings.model_validate(edits["settings"])
            agent._check_settings()  # what the model's provider cannot honour, refused before a call
        except (ValidationError, ValueError) as exc:
            raise InvalidForkError(f"settings: {exc}") from None
