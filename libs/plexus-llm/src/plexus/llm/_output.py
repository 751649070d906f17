"""Typed outputs: ``LLMAgent(output_type=SomeModel)`` validates the final answer into a pydantic type.

The request carries an `OutputSpec`; each adapter asks for it the way its provider can: OpenAI chat
completions natively (``response_format`` json_schema, strict when the schema allows it), Anthropic with a
forced output tool (`OUTPUT_TOOL`). The loop judges every turn that looks final, whatever the provider did:
a call of the output tool is validated from its arguments, a text answer from its JSON. An answer that does
not validate is fed back to the model (a tool result, or a user item) up to ``output_retries`` times, then
the message fails with `OutputValidationError`. What the judge adds to the transcript is a pure function of
the model's turn, so a replayed turn (the journal, after a crash) yields it again without being journaled.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from plexus.core import (
    BaseBlock,
    DataBlock,
    FinishReasonKind,
    Item,
    ItemKind,
    JsonValue,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

from ._accumulate import INVALID_ARGUMENTS_KEY, ModelTurn
from ._errors import OutputValidationError
from ._settings import ModelSettings

__all__ = [
    "OUTPUT_RETRY_KEY",
    "OUTPUT_TOOL",
    "OutputAttempt",
    "OutputSpec",
    "StructuredOutput",
    "anthropic_output",
    "openai_response_format",
    "strict_schema",
]

#: The name of the output tool offered to providers without native structured output.
OUTPUT_TOOL = "final_result"
#: Metadata key on the blocks the judge adds: ``accepted``, ``invalid`` or ``not_run``.
OUTPUT_RETRY_KEY = "plexus.llm.output"

_NAME = re.compile(r"[^a-zA-Z0-9_-]")
_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n(.*)\n\s*```\s*$", re.DOTALL)
#: JSON Schema keywords OpenAI's strict mode does not take: a schema using one is sent non-strict.
_NOT_STRICT = frozenset(
    {
        "oneOf",
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "patternProperties",
        "prefixItems",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "default",
    }
)


@dataclass(frozen=True, eq=False)
class OutputSpec:
    """What a model is asked to answer: the schema's ``name`` (the type's class name), its JSON Schema, the
    description (the type's docstring) and the output tool's name for providers that need one."""

    name: str
    schema: dict[str, Any]
    description: str = ""
    tool_name: str = OUTPUT_TOOL

    @cached_property
    def strict(self) -> dict[str, Any] | None:
        """The schema in OpenAI's strict form, None when it cannot be made strict without changing it."""
        return strict_schema(self.schema)

    @cached_property
    def response_format(self) -> dict[str, Any]:
        """Chat completions' ``response_format`` for this spec (computed once: a turn reuses it)."""
        strict = self.strict
        json_schema: dict[str, Any] = {
            "name": _NAME.sub("_", self.name)[:64] or "output",
            "schema": strict if strict is not None else self.schema,
            "strict": strict is not None,
        }
        if self.description:
            json_schema["description"] = self.description
        return {"type": "json_schema", "json_schema": json_schema}

    @cached_property
    def anthropic_tool(self) -> dict[str, Any]:
        description = self.description or f"Give the final answer as a {self.name}."
        return {"name": self.tool_name, "description": description, "input_schema": self.schema}


def strict_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema`` with every object closed (``additionalProperties: false``), as OpenAI's strict mode needs;
    None when strict mode would change what validates (an optional property, an open dict, a keyword strict
    mode refuses): such a schema is sent non-strict and validation catches what the model gets wrong."""
    out = copy.deepcopy(schema)
    return out if _close(out) else None


def _close(node: Any) -> bool:
    if not isinstance(node, dict):
        return True
    if _NOT_STRICT.intersection(node):
        return False
    if node.get("type") == "object":
        properties = node.get("properties")
        if not isinstance(properties, dict) or set(node.get("required", ())) != set(properties):
            return False
        if node.get("additionalProperties", False) is not False:
            return False
        node["additionalProperties"] = False
    subschemas: list[Any] = [node.get("items"), *node.get("anyOf", ())]
    for group in ("properties", "$defs"):
        subschemas.extend((node.get(group) or {}).values())
    return all(_close(s) for s in subschemas)


def openai_response_format(spec: OutputSpec) -> dict[str, Any]:
    """The body fields asking chat completions for ``spec`` natively."""
    return {"response_format": spec.response_format}


def anthropic_output(
    body: dict[str, Any], spec: OutputSpec, with_tools: dict[str, Any], settings: ModelSettings
) -> None:
    """Offer the output tool in ``body`` and make the model call a tool: the output tool by name when it is
    the only one, ``any`` tool when the agent has tools of its own (so it can still use them first).

    A ``tool_choice`` the user set wins (a model middleware forcing one tool for one call, say); the model
    may then answer in text, which is validated as JSON. Extended thinking refuses a forced tool_choice, so
    with a ``thinking_budget`` the tool is only offered (``auto``)."""
    tools = body.get("tools") or []
    body["tools"] = [*tools, spec.anthropic_tool]
    body.update(with_tools)  # the settings sent only with tools: there is one now
    if settings.tool_choice is not None:
        return
    if settings.thinking_budget is not None:
        choice: dict[str, Any] = {"type": "auto"}
    elif tools:
        choice = {"type": "any"}
    else:
        choice = {"type": "tool", "name": spec.tool_name}
    parallel = (body.get("tool_choice") or {}).get("disable_parallel_tool_use")
    if parallel is not None:
        choice["disable_parallel_tool_use"] = parallel
    body["tool_choice"] = choice


@dataclass(frozen=True)
class Verdict:
    """The judge's answer on a final-looking turn: the items to add to the transcript (the output tool's
    results, or what did not validate, for the model to answer again)."""

    items: list[Item] = field(default_factory=list)


class _Tools(Protocol):
    """What the output type checks of the agent's tools (its ToolRegistry): that none takes its name."""

    def get(self, name: str) -> object | None: ...


class StructuredOutput:
    """An agent's output type: its spec, built once, and the per-message judges."""

    def __init__(self, output_type: type[BaseModel], retries: int, tools: _Tools) -> None:
        if not (isinstance(output_type, type) and issubclass(output_type, BaseModel)):
            raise TypeError(f"output_type must be a pydantic BaseModel subclass, got {output_type!r}")
        if retries < 0:
            raise ValueError(f"output_retries must be >= 0, got {retries}")
        if tools.get(OUTPUT_TOOL) is not None:
            raise ValueError(
                f"a tool named {OUTPUT_TOOL!r} clashes with output_type's output tool: rename it"
            )
        self.output_type = output_type
        self.retries = retries
        doc = output_type.__doc__ or ""
        own_doc = doc if doc != BaseModel.__doc__ else ""
        self.spec = OutputSpec(
            name=output_type.__name__,
            schema=output_type.model_json_schema(),
            description=" ".join(own_doc.split()),
        )

    def claims(self, calls: list[ToolUseBlock]) -> bool:
        """Whether a turn's calls give the final answer (the loop then runs no tool step for it)."""
        return any(c.tool_name == self.spec.tool_name for c in calls)

    def attempt(self) -> OutputAttempt:
        return OutputAttempt(self)


class OutputAttempt:
    """The judge of one handled message: counts the answers that did not validate and keeps the ``value``
    of the one that did."""

    def __init__(self, output: StructuredOutput) -> None:
        self._output = output
        self.failures = 0
        self.value: BaseModel | None = None

    def reply(self, metadata: dict[str, JsonValue]) -> list[BaseBlock]:
        """The reply carrying the value: one DataBlock, its ``schema_id`` the schema's name."""
        assert self.value is not None
        data = self.value.model_dump(mode="json")
        return [DataBlock(data=data, schema_id=self._output.spec.name, metadata=metadata)]

    def judge(self, turn: ModelTurn) -> Verdict | None:
        """None when ``turn`` is not a final answer (tools to run, a cut answer); else the verdict. Raises
        `OutputValidationError` when the answer fails once more than ``output_retries`` allows."""
        spec = self._output.spec
        calls = turn.tool_calls
        final = [c for c in calls if c.tool_name == spec.tool_name]
        if final:
            value, errors = self._validate_call(final[0])
            results = [_result(c, "not_run", _NOT_RUN) for c in calls if c is not final[0]]
            if value is not None:
                self.value = value
                accepted = _result(final[0], "accepted", "Final result accepted.")
                return Verdict([_tool_item([accepted, *results])])
            self._failed(errors)
            feedback = f"{_describe(spec.name, errors)} Fix them and call {spec.tool_name} again."
            invalid = _result(final[0], "invalid", feedback, is_error=True)
            return Verdict([_tool_item([invalid, *results])])
        if calls or turn.finish_reason.kind not in (FinishReasonKind.COMPLETED, FinishReasonKind.OTHER):
            return None
        text = "".join(b.text for b in turn.item.blocks if isinstance(b, TextBlock))
        try:
            self.value = self._output.output_type.model_validate_json(_unfenced(text))
            return Verdict()
        except ValidationError as exc:
            errors = _errors(exc)
        self._failed(errors)
        feedback = f"{_describe(spec.name, errors)} Answer again with only the JSON object, fixed."
        block = TextBlock(text=feedback, metadata={OUTPUT_RETRY_KEY: "invalid"})
        return Verdict([Item(kind=ItemKind.USER, blocks=[block])])

    def _validate_call(self, call: ToolUseBlock) -> tuple[BaseModel | None, list[dict[str, Any]]]:
        invalid = call.metadata.get(INVALID_ARGUMENTS_KEY)
        if invalid is not None:
            msg = "the arguments are not a JSON object"
            return None, [{"type": "json_invalid", "loc": [], "msg": msg}]
        try:
            return self._output.output_type.model_validate(call.arguments), []
        except ValidationError as exc:
            return None, _errors(exc)

    def _failed(self, errors: list[dict[str, Any]]) -> None:
        self.failures += 1
        if self.failures > self._output.retries:
            name = self._output.spec.name
            raise OutputValidationError(
                f"the model's answer is not a valid {name} after {self.failures} attempt(s) "
                f"(output_retries={self._output.retries}): {_summary(errors)}",
                name,
                errors,
            )


_NOT_RUN = "Not run: the final result was given in the same turn."


def _result(call: ToolUseBlock, status: str, text: str, *, is_error: bool = False) -> ToolResultBlock:
    return ToolResultBlock(
        call_id=call.call_id,
        content=[TextBlock(text=text)],
        is_error=is_error,
        metadata={OUTPUT_RETRY_KEY: status},
    )


def _tool_item(results: list[ToolResultBlock]) -> Item:
    return Item(kind=ItemKind.TOOL, blocks=list(results))


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic's errors as JSON (no input: it may be large, and the model has it)."""
    return [
        {"type": e["type"], "loc": list(e["loc"]), "msg": e["msg"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def _summary(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in errors)


def _describe(name: str, errors: list[dict[str, Any]]) -> str:
    return f"The answer is not a valid {name}: {json.dumps(errors)}."


def _unfenced(text: str) -> str:
    """The JSON inside a markdown code fence, as models sometimes wrap it; else the text."""
    match = _FENCE.match(text)
    return match.group(1) if match else text
