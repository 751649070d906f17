"""Remote A2A agents as tools and handoff targets: ``LLMAgent(tools=[A2AAgent(url, token)])``,
``LLMAgent(handoffs=[A2AAgent(url, token)])``.

As a tool (a `ToolSource`), the remote agent's card gives the tool's name and description; a call sends the
model's ``message`` as one A2A message and answers with the remote's reply, through the loop's tool step
(journal, middleware, approvals, records). As a handoff target, the conversation so far goes to the remote
agent as one message and its answer is the reply. Either way the remote task's id is journaled as soon as
the remote accepted it (`_a2atask.py`): after a worker crash the call follows that task instead of sending
the message again. ``a2a`` is imported when a remote agent is first used, never by ``import plexus.llm``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from plexus.core import BaseBlock, Item, ItemKind, JsonValue, TextBlock, ToolUseBlock
from plexus.runtime import Context

from ._handoff import Handoff, InputFilter, without_tool_calls
from ._tools import Tool, ToolArgumentsError

if TYPE_CHECKING:
    from ._a2atask import Remote

__all__ = ["A2AAgent", "A2ATool"]

_NAME_MAX = 64
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


class _Message(BaseModel):
    """The arguments of an A2A tool: the message for the remote agent."""

    model_config = ConfigDict(extra="forbid")
    message: str = Field(description="What to ask or tell the remote agent, in full: it sees nothing else.")


_SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "message": {
            "type": "string",
            "description": "What to ask or tell the remote agent, in full: it sees nothing else.",
        }
    },
    "required": ["message"],
    "additionalProperties": False,
}


def _never_called(**_kwargs: Any) -> None:  # pragma: no cover - A2ATool.invoke_call replaces the call
    raise RuntimeError("an A2A tool is called through its remote agent")


@dataclass(frozen=True)
class A2ATool(Tool):
    """The tool a remote A2A agent offers (`A2AAgent.list_tools`)."""

    agent: A2AAgent | None = None

    async def invoke_call(self, call: ToolUseBlock, ctx: Context | None) -> Any:
        """Send the call's ``message`` (ToolArgumentsError when there is none) and return the reply; the
        call's id keys the remote task in the message's ledger."""
        parsed = self.parse(call.arguments)
        assert isinstance(parsed, _Message)
        assert self.agent is not None
        if ctx is None:
            raise ToolArgumentsError("an A2A tool runs inside an agent's handler (it journals its task)")
        return await self.agent.call(ctx, call.call_id, [TextBlock(text=parsed.message)])

    async def invoke(self, arguments: dict[str, JsonValue], ctx: Context | None) -> Any:
        raise RuntimeError("an A2A tool is called with its call (invoke_call): its id keys the remote task")


class A2AAgent:
    """A remote agent spoken to over A2A (the official ``a2a-sdk`` client), at ``url``: the agent's base URL,
    where its card is at ``/.well-known/agent-card.json`` (a Plexus gateway's: ``<gateway>/a2a/<type>``).

    ``auth``: a bearer token, or the headers every request carries (``{"x-api-key": ...}``). ``name``: the
    tool's name (default: the card's name) and the handoff's ``transfer_to_<name>`` (default: the URL's last
    path segment); ``description`` overrides the card's. ``timeout_s`` bounds one call, waiting included
    (then `A2ATimeoutError`, and the remote task is cancelled); ``connect_timeout_s`` the card's read;
    ``poll_s`` is the ``tasks/get`` interval for an agent that does not stream. ``input_filter`` maps the
    conversation a handoff sends (default: `without_tool_calls`, the words only).
    """

    def __init__(
        self,
        url: str,
        auth: str | Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 30.0,
        poll_s: float = 1.0,
        input_filter: InputFilter | None = without_tool_calls,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"an A2A agent's URL is http(s)://..., got {url!r}")
        if not (timeout_s > 0 and connect_timeout_s > 0 and poll_s > 0):
            raise ValueError(f"timeouts must be > 0, got {timeout_s}, {connect_timeout_s}, {poll_s}")
        self.url = url.rstrip("/")
        if auth is None:
            self.headers: dict[str, str] = {}
        elif isinstance(auth, str):
            self.headers = {"Authorization": f"Bearer {auth}"}
        else:
            self.headers = dict(auth)
        self.name = _sanitize(name) if name else None
        self.description = description
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.poll_s = poll_s
        self.input_filter = input_filter
        self._tools: list[Tool] | None = None

    def __repr__(self) -> str:
        return f"A2AAgent({self.url!r})"

    @property
    def remote(self) -> Remote:
        from ._a2atask import remote_for

        return remote_for(self.url, self.headers, self.connect_timeout_s, self.poll_s)

    async def list_tools(self) -> Sequence[Tool]:
        """The one tool this agent is (`ToolSource`): named and described by its card, read once."""
        if self._tools is None:
            card = await self.remote.card()
            skills = "; ".join(f"{s.name}: {s.description}" if s.description else s.name for s in card.skills)
            description = self.description or card.description or f"the remote agent {card.name}"
            if skills and self.description is None:
                description = f"{description} (skills: {skills})"
            self._tools = [
                A2ATool(
                    name=self.name or _sanitize(card.name or self.url.rsplit("/", 1)[-1]),
                    description=description.strip(),
                    fn=_never_called,
                    arguments_model=_Message,
                    timeout_s=None,  # the remote call has its own bound (timeout_s), waiting included
                    schema=dict(_SCHEMA),
                    agent=self,
                )
            ]
        return self._tools

    def as_handoff(self) -> Handoff:
        """``LLMAgent(handoffs=[A2AAgent(...)])``: a ``transfer_to_<name>`` tool naming this agent."""
        name = self.name or _sanitize(self.url.rsplit("/", 1)[-1])
        description = self.description or f"Hand the conversation over to the remote agent {name}."
        return Handoff(name, description=description, timeout_s=self.timeout_s, remote=self)

    async def call(self, ctx: Context, call_id: str, blocks: Sequence[BaseBlock]) -> list[BaseBlock]:
        """Send ``blocks`` as one message for call ``call_id`` of ``ctx``'s message; the remote's answer."""
        return await self.remote.call(ctx, call_id, blocks, self.timeout_s)

    async def hand_over(self, ctx: Context, items: Sequence[Item], call_id: str) -> list[BaseBlock]:
        """A handoff: the conversation (through ``input_filter``) as one text message; the answer."""
        kept = list(self.input_filter(list(items))) if self.input_filter is not None else list(items)
        return await self.call(ctx, call_id, [TextBlock(text=conversation_text(kept))])


def conversation_text(items: Sequence[Item]) -> str:
    """A conversation as one text: each item's text under its role (``user: ...``), a lone user item as is."""
    said = [(i.kind, " ".join(b.text for b in i.blocks if isinstance(b, TextBlock)).strip()) for i in items]
    said = [(kind, text) for kind, text in said if text and kind is not ItemKind.SYSTEM]
    if len(said) == 1 and said[0][0] is ItemKind.USER:
        return said[0][1]
    return "\n\n".join(f"{kind.value}: {text}" for kind, text in said)


def _sanitize(name: str) -> str:
    return (_NOT_NAME.sub("_", name) or "a2a_agent")[:_NAME_MAX]
