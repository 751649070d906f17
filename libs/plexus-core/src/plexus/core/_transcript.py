"""The transcript (seed 002): a flat list of `Item`s, each a role (`ItemKind`) plus content blocks.

Seed 004 adds session-only items that never reach a model. They are ordinary `Item`s of the kinds
``CUSTOM``, ``BRANCH_SUMMARY`` and ``COMPACTION_SUMMARY``; their payload lives in blocks and namespaced
metadata keys instead of dedicated classes, so storage, compaction and reporting handle one type:

- ``CustomMessage``: kind ``CUSTOM``, metadata ``"plexus.custom_type"`` (required, a non-empty string that
  extensions dispatch on), any blocks.
- ``BranchSummaryMessage``: kind ``BRANCH_SUMMARY``, one `TextBlock` holding the summary, optional metadata
  ``"plexus.branch_from_id"`` (the entry the abandoned branch started from).
- ``CompactionSummaryMessage``: kind ``COMPACTION_SUMMARY``, one `TextBlock` holding the summary, optional
  metadata ``"plexus.tokens_before"`` (context size before compaction).

`model_items` turns the two summaries into user items and drops custom items before a model call.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, model_validator

from ._content import BaseBlock, ContentBlock, TextBlock, ToolResultBlock, ToolUseBlock
from ._errors import ProtocolError
from ._ids import MessageId
from ._json import JsonValue, sort_keys_deep

__all__ = [
    "ANTHROPIC_ROLE",
    "ANTHROPIC_SYSTEM_KINDS",
    "BRANCH_FROM_KEY",
    "CUSTOM_TYPE_KEY",
    "MODEL_KINDS",
    "OPENAI_ROLE",
    "ROLE_BLOCK_TYPES",
    "SESSION_ONLY_KINDS",
    "SUMMARY_OF_KEY",
    "TOKENS_BEFORE_KEY",
    "Item",
    "ItemKind",
    "ItemView",
    "Metadata",
    "ToolPairing",
    "branch_summary_item",
    "check_tool_pairing",
    "compaction_summary_item",
    "custom_item",
    "model_items",
    "validate_roles",
]

CUSTOM_TYPE_KEY = "plexus.custom_type"
BRANCH_FROM_KEY = "plexus.branch_from_id"
TOKENS_BEFORE_KEY = "plexus.tokens_before"
#: Set by `model_items` on the user item it makes from a summary: ``"branch"`` or ``"compaction"``.
SUMMARY_OF_KEY = "plexus.summary_of"


class ItemKind(enum.Enum):
    """The role of an item, ordered ``SYSTEM < DEVELOPER < USER < ASSISTANT < TOOL < CONTEXT``.

    Compaction strategies sort and prioritise by this order. The session-only kinds sort after every model
    kind (``CONTEXT < CUSTOM < BRANCH_SUMMARY < COMPACTION_SUMMARY``) because they never reach a model and
    so have no place in the model-role priority. Values are lower-case strings on the wire. Not a
    ``StrEnum`` on purpose: string comparison would order kinds alphabetically.
    """

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    CONTEXT = "context"
    CUSTOM = "custom"
    BRANCH_SUMMARY = "branch_summary"
    COMPACTION_SUMMARY = "compaction_summary"

    @property
    def rank(self) -> int:
        """Position in declaration order; the basis of comparisons."""
        return _RANK[self]

    @property
    def is_session_only(self) -> bool:
        """True for kinds that exist for the UI and context rebuilding and never go to a model."""
        return self in SESSION_ONLY_KINDS

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ItemKind):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, ItemKind):
            return NotImplemented
        return self.rank <= other.rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, ItemKind):
            return NotImplemented
        return self.rank > other.rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, ItemKind):
            return NotImplemented
        return self.rank >= other.rank


_RANK: dict[ItemKind, int] = {kind: i for i, kind in enumerate(ItemKind)}

SESSION_ONLY_KINDS: frozenset[ItemKind] = frozenset(
    {ItemKind.CUSTOM, ItemKind.BRANCH_SUMMARY, ItemKind.COMPACTION_SUMMARY}
)
MODEL_KINDS: frozenset[ItemKind] = frozenset(ItemKind) - SESSION_ONLY_KINDS

# Seed 002: System, Developer and Context all become "system"; they differ only for compaction.
OPENAI_ROLE: Mapping[ItemKind, str] = {
    ItemKind.SYSTEM: "system",
    ItemKind.DEVELOPER: "system",
    ItemKind.USER: "user",
    ItemKind.ASSISTANT: "assistant",
    ItemKind.TOOL: "tool",
    ItemKind.CONTEXT: "system",
}

# Anthropic has no system role inside ``messages``: "system" here means "goes into the top-level ``system``
# parameter". Tool results travel as ``tool_result`` blocks in a user turn.
ANTHROPIC_ROLE: Mapping[ItemKind, str] = {
    ItemKind.SYSTEM: "system",
    ItemKind.DEVELOPER: "system",
    ItemKind.USER: "user",
    ItemKind.ASSISTANT: "assistant",
    ItemKind.TOOL: "user",
    ItemKind.CONTEXT: "system",
}
ANTHROPIC_SYSTEM_KINDS: frozenset[ItemKind] = frozenset(k for k, r in ANTHROPIC_ROLE.items() if r == "system")

# Seed 004's per-role content constraints, by block ``type``. UI resources appear nowhere: models only ever
# see text, so an adapter must render them to text first.
_SYSTEM_BLOCKS = frozenset({"text"})
ROLE_BLOCK_TYPES: Mapping[ItemKind, frozenset[str]] = {
    ItemKind.SYSTEM: _SYSTEM_BLOCKS,
    ItemKind.DEVELOPER: _SYSTEM_BLOCKS,
    ItemKind.CONTEXT: _SYSTEM_BLOCKS,
    ItemKind.USER: frozenset({"text", "image", "audio", "video", "document", "data", "tool_result"}),
    ItemKind.ASSISTANT: frozenset({"text", "thinking", "tool_use", "code", "data"}),
    ItemKind.TOOL: frozenset({"tool_result", "error"}),
}


def _sorted_metadata(value: dict[str, JsonValue]) -> JsonValue:
    return sort_keys_deep(value)


Metadata = Annotated[dict[str, JsonValue], PlainSerializer(_sorted_metadata)]
"""A metadata bag (namespaced keys such as ``"openrouter.model"``) that serializes with keys sorted at
every depth, so equal bags give identical JSON whatever their insertion order (seed 002's BTreeMap)."""


class Item(BaseModel):
    """One transcript entry: a role, its content blocks and a metadata bag. Frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: MessageId | None = None
    kind: ItemKind
    blocks: list[ContentBlock] = Field(default_factory=list)
    metadata: Metadata = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_session_payload(self) -> Self:
        if self.kind is ItemKind.CUSTOM:
            custom_type = self.metadata.get(CUSTOM_TYPE_KEY)
            if not isinstance(custom_type, str) or not custom_type:
                raise ValueError(
                    f"an item of kind 'custom' needs a non-empty string metadata[{CUSTOM_TYPE_KEY!r}]"
                )
        elif self.kind in (ItemKind.BRANCH_SUMMARY, ItemKind.COMPACTION_SUMMARY) and not any(
            isinstance(b, TextBlock) for b in self.blocks
        ):
            raise ValueError(f"an item of kind {self.kind.value!r} needs a text block holding the summary")
        return self

    @property
    def text(self) -> str:
        """The item's text blocks joined with newlines."""
        return "\n".join(b.text for b in self.blocks if isinstance(b, TextBlock))

    def validate_for_model(self) -> None:
        """Raise `ProtocolError` unless this item may be sent to a model as is (seed 004's role rules)."""
        problem = _role_problem(self)
        if problem is not None:
            raise ProtocolError(problem)


@runtime_checkable
class ItemView(Protocol):
    """A read-only view of an item, for code that works on projected or wrapped items (`Item` is one)."""

    @property
    def kind(self) -> ItemKind: ...

    @property
    def blocks(self) -> Sequence[BaseBlock]: ...

    @property
    def metadata(self) -> Mapping[str, JsonValue]: ...


def _role_problem(item: ItemView) -> str | None:
    if item.kind.is_session_only:
        return (
            f"an item of kind {item.kind.value!r} is session-only and never goes to a model (use model_items)"
        )
    allowed = ROLE_BLOCK_TYPES[item.kind]
    for position, block in enumerate(item.blocks):
        if block.type not in allowed:
            return (
                f"an item of kind {item.kind.value!r} may not hold a block of type {block.type!r} "
                f"(block {position}); "
                f"allowed: {', '.join(sorted(allowed))}"
            )
    return None


def validate_roles(items: Iterable[ItemView]) -> None:
    """Raise `ProtocolError` naming the item index, kind and block type of the first role violation."""
    for index, item in enumerate(items):
        problem = _role_problem(item)
        if problem is not None:
            raise ProtocolError(f"item {index}: {problem}")


def check_tool_pairing(items: Iterable[ItemView], *, strict: bool = False) -> None:
    """Check that tool calls and results pair up, in order; raise `ProtocolError` at the first fault.

    Faults: two calls with one ``call_id``; a result whose call did not come earlier; a second result for
    one call; and, when ``strict``, calls still unanswered at the end (a transcript being sent to a model
    must be strict; one mid-turn may have calls in flight). Session-only items are skipped.
    """
    pairing = ToolPairing()
    for item in items:
        pairing.add(item)
    if strict:
        pairing.check_answered()


class ToolPairing:
    """`check_tool_pairing` one item at a time: a transcript that grows is checked for its new items only."""

    __slots__ = ("_answered", "_called", "_index")

    def __init__(self) -> None:
        self._called: dict[str, int] = {}  # call_id -> index of the item holding the call
        self._answered: set[str] = set()
        self._index = 0  # of the next item

    def add(self, item: ItemView) -> None:
        """Check the next item against the ones before it (`ProtocolError` at a fault)."""
        index = self._index
        self._index += 1
        if item.kind.is_session_only:
            return
        called, answered = self._called, self._answered
        for block in item.blocks:
            if isinstance(block, ToolUseBlock):
                if block.call_id in called:
                    raise ProtocolError(
                        f"item {index}: duplicate tool call id {block.call_id!r} "
                        f"(first used in item {called[block.call_id]})"
                    )
                called[block.call_id] = index
            elif isinstance(block, ToolResultBlock):
                if block.call_id not in called:
                    raise ProtocolError(
                        f"item {index}: tool result for {block.call_id!r} has no matching earlier tool call"
                    )
                if block.call_id in answered:
                    raise ProtocolError(f"item {index}: second tool result for call {block.call_id!r}")
                answered.add(block.call_id)

    def check_answered(self) -> None:
        """Raise `ProtocolError` when a call so far has no result (the strict end of a transcript)."""
        pending = [call_id for call_id in self._called if call_id not in self._answered]
        if pending:
            raise ProtocolError(f"tool calls without a result: {', '.join(map(repr, pending))}")


# -- session-only items ---------------------------------------------------------------------------------


def custom_item(
    custom_type: str,
    blocks: Sequence[BaseBlock] = (),
    *,
    metadata: Mapping[str, JsonValue] | None = None,
    id: MessageId | None = None,
) -> Item:
    """An extension's session-only item (seed 004 ``CustomMessage``)."""
    return Item(
        id=id,
        kind=ItemKind.CUSTOM,
        blocks=list(blocks),
        metadata={**(metadata or {}), CUSTOM_TYPE_KEY: custom_type},
    )


def branch_summary_item(summary: str, *, from_id: str | None = None, id: MessageId | None = None) -> Item:
    """The summary of an abandoned branch (seed 004 ``BranchSummaryMessage``)."""
    metadata: dict[str, JsonValue] = {} if from_id is None else {BRANCH_FROM_KEY: from_id}
    return Item(id=id, kind=ItemKind.BRANCH_SUMMARY, blocks=[TextBlock(text=summary)], metadata=metadata)


def compaction_summary_item(
    summary: str, *, tokens_before: int | None = None, id: MessageId | None = None
) -> Item:
    """The summary that replaces compacted history (seed 004 ``CompactionSummaryMessage``)."""
    metadata: dict[str, JsonValue] = {} if tokens_before is None else {TOKENS_BEFORE_KEY: tokens_before}
    return Item(id=id, kind=ItemKind.COMPACTION_SUMMARY, blocks=[TextBlock(text=summary)], metadata=metadata)


_SUMMARY_PREAMBLE: Mapping[ItemKind, tuple[str, str]] = {
    ItemKind.BRANCH_SUMMARY: (
        "branch",
        "The conversation returned here from another branch. Summary of that branch:",
    ),
    ItemKind.COMPACTION_SUMMARY: (
        "compaction",
        "Earlier conversation history was compacted. Summary of it:",
    ),
}


def model_items(items: Iterable[Item], *, summary_kind: ItemKind = ItemKind.USER) -> list[Item]:
    """The items a model should see: custom items dropped, summaries turned into ``summary_kind`` items.

    Summaries become user items by default rather than system/context ones because they mark a point in the
    conversation ("it branched here"), and Anthropic lifts every system-like kind out of ``messages``,
    which would lose that position. The summary is wrapped in ``<summary>`` tags after a one-line preamble
    so the model can tell it from something the user typed.
    """
    if summary_kind not in (ItemKind.USER, ItemKind.CONTEXT):
        raise ValueError(f"summaries can become user or context items, not {summary_kind.value}")
    out: list[Item] = []
    for item in items:
        if item.kind is ItemKind.CUSTOM:
            continue
        preamble = _SUMMARY_PREAMBLE.get(item.kind)
        if preamble is None:
            out.append(item)
            continue
        summary_of, intro = preamble
        metadata: dict[str, Any] = {**item.metadata, SUMMARY_OF_KEY: summary_of}
        text = f"{intro}\n<summary>\n{item.text}\n</summary>"
        out.append(Item(id=item.id, kind=summary_kind, blocks=[TextBlock(text=text)], metadata=metadata))
    return out
