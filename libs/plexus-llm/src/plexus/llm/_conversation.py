"""`Conversation`: the transcript an `LLMAgent` keeps in its state across messages, and its size limit.

The state holds the items as JSON (what a checkpoint stores); the agent keeps the item objects it wrote
last, so the next message takes them as they are instead of validating every one again.
"""

from __future__ import annotations

from typing import Any

from plexus.core import Item

from ._errors import TranscriptTooLargeError
from ._memo import encode_json, transcript_bytes, transcript_json

__all__ = ["TRANSCRIPT_KEY", "Conversation", "check_size"]

#: Agent state key of the conversation so far (a list of item dicts), kept across messages.
TRANSCRIPT_KEY = "plexus.llm.transcript"


class Conversation:
    """The transcript of one agent activation's state (see the module's docstring)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        #: The state's transcript as this activation last wrote it, its JSON and its items (while the state
        #: holds that).
        self._kept: tuple[list[Any], bytes, list[Item]] | None = None

    def history(self, state: dict[str, Any]) -> list[Item]:
        """The conversation so far: the items this activation kept last time when the state still holds
        what it wrote then, else validated from the state (a new activation, a restored or edited state)."""
        raw = state.get(TRANSCRIPT_KEY, [])
        kept = self._kept
        # The JSON is compared, not only the list: an item's dict may have been changed in place. Encoding
        # costs a thirtieth of validating (0.04 against 1.3 ms for 200 items).
        if kept is not None and kept[0] is raw and encode_json(raw) == kept[1]:
            return list(kept[2])
        return [Item.model_validate(d) for d in raw]

    def keep(self, state: dict[str, Any], items: list[Item]) -> None:
        """Put the conversation into the state, each item dumped once while it lives."""
        raw = state[TRANSCRIPT_KEY] = transcript_json(items)
        self._kept = (raw, encode_json(raw), list(items))


def check_size(items: list[Item], limit: int | None) -> None:
    """Refuse a model call whose turn the agent's state could not store (it is committed whole, and a
    NATS message holds 1 MiB by default): the call would be paid for, then the commit fail, every time."""
    if limit is None:
        return
    size = transcript_bytes(items)
    if size > limit:
        raise TranscriptTooLargeError(
            f"the conversation is {size} bytes of JSON, over max_transcript_bytes={limit}: compact it "
            "(LLMAgent(compaction=CompactionPipeline([...], max_bytes=...))) or go on under a new key",
            size,
            limit,
        )
