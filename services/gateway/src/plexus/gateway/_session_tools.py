"""A session run's tool calls and results, as transcript items (seed 003's transcript keeps them).

The session's agent reports each tool call and each result as a progress event (steps ``tool_call``
and ``tool_result``: `LLMAgent` does for every tool it runs, any agent may). Those events are durable,
on the run's progress subject of that agent, so once the run has ended the gateway reads them back in
order and writes them into the transcript with the run's ending, in one write: the gateway never imports
plexus.llm and the agent never learns where sessions live. A call becomes an ``assistant`` item, a result
a ``tool`` item, each holding the event's blocks; events of the run's children (other agents) are not the
session's conversation.
"""

from __future__ import annotations

import json
from typing import Any

from nats.js.errors import NotFoundError

from plexus.core import (
    AgentId,
    AgentProgress,
    AgentStep,
    Item,
    ItemKind,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from plexus.runtime import Runtime

from ._sessions import RUN_ID_KEY

__all__ = ["STEP_KEY", "item_line", "tool_items"]

#: Metadata key of a tool item: the progress step it was made from (``tool_call`` or ``tool_result``).
STEP_KEY = "plexus.step"
_KINDS = {AgentStep.TOOL_CALL: ItemKind.ASSISTANT, AgentStep.TOOL_RESULT: ItemKind.TOOL}


async def tool_items(rt: Runtime, record: dict[str, Any]) -> list[Item]:
    """The tool call and result items of the ended run ``record`` (a run record as the gateway reads it),
    in the order its agent reported them."""
    agent = AgentId.parse(str(record["agent_id"]))
    run_id = str(record["run_id"])
    root_id = str(record.get("root_id") or run_id)
    subject = rt.subjects_for(agent.namespace).progress(root_id, agent.type, agent.key)
    stream = rt.topology.names.progress_stream
    items: list[Item] = []
    seq = 1
    while True:
        try:
            msg = await rt.js.get_msg(stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return items
        seq = (msg.seq or seq) + 1
        event = AgentProgress.model_validate_json(msg.data or b"{}")
        kind = _KINDS.get(event.step)
        if kind is not None and event.run_id == run_id:
            metadata = {RUN_ID_KEY: run_id, STEP_KEY: str(event.step)}
            items.append(Item(kind=kind, blocks=list(event.content), metadata=metadata))


def item_line(item: Item) -> str:
    """One line for ``plexus sessions show``: the kind, then the text, tool calls and tool results."""
    parts: list[str] = []
    for block in item.blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(f"{block.tool_name}({json.dumps(block.arguments)}) [{block.call_id}]")
        elif isinstance(block, ToolResultBlock):
            shown = " ".join(b.text for b in block.content if isinstance(b, TextBlock)) or block.type
            parts.append(f"[{block.call_id}] {'error: ' if block.is_error else ''}{shown}")
        else:
            parts.append(f"<{block.type}>")
    return f"{item.kind.value:<10} {' '.join(parts)}".rstrip()
