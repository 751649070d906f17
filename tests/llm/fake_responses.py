"""A fake OpenAI Responses API on the loopback `FakeProvider`: the real ``/v1/responses`` SSE event stream
(``response.created`` … ``response.output_item.done`` … ``response.completed``), and a `ReasoningLedger` that
checks, as the real service does with ``store=False``, that every reasoning item it issued comes back
unchanged, and before the function calls it preceded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .fake_providers import Answer, Drop, Sse, Status

__all__ = ["Reasoning", "ReasoningLedger", "event_frame", "responses_frames"]


@dataclass(frozen=True)
class Reasoning:
    """A reasoning item: its summary parts (streamed as summary text deltas) and its encrypted content."""

    summary: Sequence[str]
    encrypted: str
    id: str = "rs_fake"


def event_frame(name: str, seq: int = 0, **data: Any) -> str:
    """One SSE frame of the Responses stream: the event ``name`` with its ``data`` fields."""
    return f"event: {name}\ndata: {json.dumps({'type': name, 'sequence_number': seq, **data})}\n\n"


class _Frames:
    def __init__(self) -> None:
        self.frames: list[str] = []
        self.seq = 0

    def add(self, name: str, **data: Any) -> None:
        self.frames.append(event_frame(name, self.seq, **data))
        self.seq += 1


def _response(
    status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, **extra: Any
) -> dict[str, Any]:
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1700000000,
        "model": "fake-model",
        "status": status,
        "output": output,
        "usage": usage,
        "error": None,
        "incomplete_details": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        **extra,
    }


def responses_frames(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    *,
    reasoning: Reasoning | None = None,
    items: Sequence[dict[str, Any]] = (),
    split: int = 4,
    incomplete: str | None = None,
    usage: tuple[int, int, int, int] = (12, 7, 2, 3),
    end: bool = True,
) -> list[str]:
    """The events of one streamed response, in output order: an optional reasoning item (summary deltas, then
    the whole item with its encrypted content in ``output_item.done``), ``items`` as they are (added and
    done, e.g. an item type the SDK does not know), a message whose text comes in 5-character deltas, then
    each function call (id ``fc_<n>``; call id, name, arguments JSON text) with its arguments in ``split``
    -character deltas; then ``response.completed`` (or ``response.incomplete`` with ``incomplete`` as the
    reason) with usage (input, output, cached, reasoning). ``end=False`` leaves out the completion event."""
    f = _Frames()
    f.add("response.created", response=_response("in_progress", [], None))
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        index = len(output)
        empty = {"type": "reasoning", "id": reasoning.id, "summary": []}
        f.add("response.output_item.added", output_index=index, item=empty)
        for n, summary in enumerate(reasoning.summary):
            common = {"item_id": reasoning.id, "output_index": index, "summary_index": n}
            f.add(
                "response.reasoning_summary_part.added", **common, part={"type": "summary_text", "text": ""}
            )
            for i in range(0, len(summary), 6):
                f.add("response.reasoning_summary_text.delta", **common, delta=summary[i : i + 6])
            f.add("response.reasoning_summary_text.done", **common, text=summary)
        done = {
            "type": "reasoning",
            "id": reasoning.id,
            "summary": [{"type": "summary_text", "text": s} for s in reasoning.summary],
            "encrypted_content": reasoning.encrypted,
        }
        f.add("response.output_item.done", output_index=index, item=done)
        output.append(done)
    for item in items:
        f.add("response.output_item.added", output_index=len(output), item=item)
        f.add("response.output_item.done", output_index=len(output), item=item)
        output.append(item)
    if text:
        index = len(output)
        msg_id = f"msg_{index}"
        head: dict[str, Any] = {
            "type": "message",
            "id": msg_id,
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        f.add("response.output_item.added", output_index=index, item=head)
        part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
        common = {"item_id": msg_id, "output_index": index, "content_index": 0}
        f.add("response.content_part.added", **common, part=part)
        for i in range(0, len(text), 5):
            f.add("response.output_text.delta", **common, delta=text[i : i + 5], logprobs=[])
        f.add("response.output_text.done", **common, text=text, logprobs=[])
        whole = {**part, "text": text}
        f.add("response.content_part.done", **common, part=whole)
        done = {**head, "status": "completed", "content": [whole]}
        f.add("response.output_item.done", output_index=index, item=done)
        output.append(done)
    for call_id, name, arguments in tool_calls:
        index = len(output)
        fc_id = f"fc_{index}"
        head = {
            "type": "function_call",
            "id": fc_id,
            "call_id": call_id,
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        f.add("response.output_item.added", output_index=index, item=head)
        for i in range(0, len(arguments), split):
            f.add(
                "response.function_call_arguments.delta",
                item_id=fc_id,
                output_index=index,
                delta=arguments[i : i + split],
            )
        f.add("response.function_call_arguments.done", item_id=fc_id, output_index=index, arguments=arguments)
        done = {**head, "arguments": arguments, "status": "completed"}
        f.add("response.output_item.done", output_index=index, item=done)
        output.append(done)
    if end:
        prompt, completion, cached, reasoning_tokens = usage
        wire_usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt + completion,
        }
        if incomplete is None:
            f.add("response.completed", response=_response("completed", output, wire_usage))
        else:
            response = _response("incomplete", output, wire_usage, incomplete_details={"reason": incomplete})
            f.add("response.incomplete", response=response)
    return f.frames


def _error(code: int, message: str, kind: str = "invalid_request_error") -> Status:
    return Status(code, {"error": {"message": message, "type": kind, "param": "input", "code": None}})


@dataclass
class ReasoningLedger:
    """Wraps a responder: remembers each reasoning item it streamed (and the calls that followed it) and
    answers a later request that sends one back changed (400), or omits it before its calls (400), or sends
    one it never issued (404), as the Responses API does when nothing is stored."""

    responder: Callable[[dict[str, Any]], Answer]
    issued: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: call id -> id of the reasoning item it followed
    calls: dict[str, str] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> Answer:
        problem = self._check(body.get("input", []))
        if problem is not None:
            self.refusals.append(str(problem.body["error"]["message"]))
            return problem
        answer = self.responder(body)
        if isinstance(answer, Sse | Drop):
            self._remember(answer.frames)
        return answer

    def _check(self, items: list[dict[str, Any]]) -> Status | None:
        seen: set[str] = set()
        for item in items:
            if item.get("type") == "reasoning":
                rs_id = str(item.get("id"))
                issued = self.issued.get(rs_id)
                if issued is None:
                    return _error(
                        404,
                        f"Item with id '{rs_id}' not found. Items are not persisted when `store` is set "
                        "to false.",
                    )
                if item != issued:
                    return _error(400, f"The encrypted content for item {rs_id} could not be verified.")
                seen.add(rs_id)
            elif item.get("type") == "function_call":
                needed = self.calls.get(str(item.get("call_id")))
                if needed is not None and needed not in seen:
                    return _error(
                        400,
                        f"Item of type 'function_call' was provided without its required 'reasoning' item: "
                        f"'{needed}'.",
                    )
        return None

    def _remember(self, frames: Sequence[str]) -> None:
        last: str | None = None
        for frame in frames:
            data = json.loads(frame.split("data: ", 1)[1])
            if data["type"] != "response.output_item.done":
                continue
            item = data["item"]
            if item["type"] == "reasoning":
                last = item["id"]
                self.issued[last] = item
            elif item["type"] == "function_call" and last is not None:
                self.calls[item["call_id"]] = last
