"""Which provider made a reasoning block, so a transcript that crosses providers sends none of it elsewhere.

Each adapter sends its own reasoning back verbatim (Anthropic thinking + signature, a Responses reasoning
item, Gemini thought signatures), and another provider refuses it or misreads it: shapes cannot tell them
apart (an Anthropic signature is base64 like a Gemini one). So the adapters name themselves on their
`ReasoningDeltaEvent`s, the accumulator records that name in the `ThinkingBlock`'s metadata under
`PROVIDER_KEY`, and each adapter's conversion drops the reasoning another provider made. A block without the
key (journaled before it existed, or built by hand) is left to the adapter's own check of its shape.
"""

from __future__ import annotations

from plexus.core import BaseBlock, JsonValue, ThinkingBlock

__all__ = [
    "ANTHROPIC",
    "GEMINI",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "PROVIDER_KEY",
    "foreign_reasoning",
    "made_by",
]

#: Metadata key of a ThinkingBlock: the provider whose adapter made it.
PROVIDER_KEY = "plexus.llm.provider"

ANTHROPIC = "anthropic"
GEMINI = "gemini"
OPENAI_CHAT = "openai.chat"
OPENAI_RESPONSES = "openai.responses"


def made_by(provider: str) -> dict[str, JsonValue]:
    """The metadata of a reasoning block ``provider`` made (none when it is unknown)."""
    return {PROVIDER_KEY: provider} if provider else {}


def foreign_reasoning(block: BaseBlock, provider: str) -> bool:
    """Whether ``block`` is reasoning known to come from another provider than ``provider``."""
    if not isinstance(block, ThinkingBlock):
        return False
    maker = block.metadata.get(PROVIDER_KEY)
    return maker is not None and maker != provider
