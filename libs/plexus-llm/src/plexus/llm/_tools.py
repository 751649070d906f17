"""Tools: a function plus the JSON Schema of its arguments, generated from its type hints by pydantic.

A parameter annotated `Context` (or named ``ctx``) receives the handler's Context and is not part of the
schema, so a tool can ``ctx.spawn`` a sub-agent (counted in the run's SpawnBudget) or ``ctx.send``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from plexus.core import BaseBlock, DataBlock, ErrorBlock, JsonValue, TextBlock, ToolUseBlock
from plexus.runtime import Context

from ._client import ToolSpec

__all__ = ["Tool", "ToolArgumentsError", "ToolRegistry", "tool", "tool_output_blocks"]

ToolMode = Literal["parallel", "sequential", "batch"]


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's schema."""


@dataclass(frozen=True)
class Tool:
    """One tool. ``mode``: ``parallel`` tools of one turn run concurrently, ``sequential`` ones one by one
    after them, in call order; a ``batch`` tool gets all its calls of a turn in ONE invocation (its function
    takes ``calls: list[Model]`` and returns one output per call, in order). ``timeout_s`` bounds one
    invocation (the model then sees an ErrorBlock)."""

    name: str
    description: str
    fn: Callable[..., Any]
    arguments_model: type[BaseModel]
    context_param: str | None = None
    mode: ToolMode = "parallel"
    timeout_s: float | None = None
    schema: dict[str, JsonValue] = field(default_factory=dict)
    #: The loop suspends before running this tool until `approve` decides (see `_approvals.py`).
    needs_approval: bool = False

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.schema)

    async def invoke(self, arguments: dict[str, JsonValue], ctx: Context | None) -> Any:
        """Validate ``arguments`` (ToolArgumentsError) and run the function, sync ones in a thread."""
        parsed = self.parse(arguments)
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        return await self._run(kwargs, ctx)

    async def invoke_call(self, call: ToolUseBlock, ctx: Context | None) -> Any:
        """Run one call of the model: `invoke` with its arguments (a tool that journals what it started,
        keyed by the call's id, overrides this: `A2ATool`)."""
        return await self.invoke(call.arguments, ctx)

    def parse(self, arguments: dict[str, JsonValue]) -> BaseModel:
        """The validated arguments of one call (ToolArgumentsError when they do not fit the schema)."""
        try:
            return self.arguments_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolArgumentsError(_brief(exc)) from None

    async def invoke_batch(self, calls: list[BaseModel], ctx: Context | None) -> list[Any]:
        """Run a batch tool once for ``calls`` (already parsed); one output per call, in order."""
        outputs = await self._run({"calls": calls}, ctx)
        if not isinstance(outputs, list) or len(outputs) != len(calls):
            raise TypeError(f"batch tool {self.name} must return a list of {len(calls)} outputs")
        return outputs

    async def _run(self, kwargs: dict[str, Any], ctx: Context | None) -> Any:
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        if inspect.iscoroutinefunction(self.fn):
            call: Awaitable[Any] = self.fn(**kwargs)
        else:
            call = asyncio.to_thread(self.fn, **kwargs)
        if self.timeout_s is None:
            return await call
        return await asyncio.wait_for(call, self.timeout_s)


def _brief(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    mode: ToolMode = "parallel",
    timeout_s: float | None = None,
    needs_approval: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    mode: ToolMode = "parallel",
    timeout_s: float | None = None,
    needs_approval: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` from a function (usable bare, ``@tool``, or with options, ``@tool(mode=...)``).

    The description defaults to the docstring; the schema comes from the annotated parameters.
    """

    def build(f: Callable[..., Any]) -> Tool:
        hints = get_type_hints(f)
        fields: dict[str, Any] = {}
        context_param: str | None = None
        for param in inspect.signature(f).parameters.values():
            annotation = hints.get(param.name, inspect.Parameter.empty)
            if annotation is Context or param.name == "ctx":
                context_param = param.name
                continue
            _check_parameter(f, param, annotation)
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (annotation, default)
        tool_name = name or f.__name__
        model: type[BaseModel]
        if mode == "batch":
            model = _batch_model(tool_name, fields)
        else:
            model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        schema = model.model_json_schema()
        schema.pop("title", None)
        return Tool(
            name=tool_name,
            description=(description or inspect.getdoc(f) or "").strip(),
            fn=f,
            arguments_model=model,
            context_param=context_param,
            mode=mode,
            timeout_s=timeout_s,
            schema=schema,
            needs_approval=needs_approval,
        )

    return build(fn) if fn is not None else build


def _check_parameter(f: Callable[..., Any], param: inspect.Parameter, annotation: Any) -> None:
    """Refuse what would give the model a schema without types, or arguments it cannot name."""
    where = f"@tool {getattr(f, '__qualname__', f)!s}"
    if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        stars = "*" if param.kind is inspect.Parameter.VAR_POSITIONAL else "**"
        raise TypeError(
            f"{where}: parameter {stars}{param.name} is not allowed (a model calls a tool with named "
            "arguments from a JSON Schema); declare each argument as a parameter with a type hint"
        )
    if param.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise TypeError(
            f"{where}: parameter {param.name!r} is positional-only; a model passes arguments by name"
        )
    if annotation is inspect.Parameter.empty:
        raise TypeError(
            f"{where}: parameter {param.name!r} has no type hint; the model is told each argument's type "
            f"from it (e.g. `{param.name}: int`; `{param.name}: Any` accepts anything)"
        )


def _batch_model(tool_name: str, fields: dict[str, Any]) -> type[BaseModel]:
    annotation = fields.get("calls", (None,))[0]
    args = get_args(annotation)
    if set(fields) != {"calls"} or get_origin(annotation) is not list or len(args) != 1:
        raise TypeError(f"batch tool {tool_name} must take one parameter `calls: list[SomeModel]`")
    item = args[0]
    if not (isinstance(item, type) and issubclass(item, BaseModel)):
        raise TypeError(f"batch tool {tool_name}: the items of `calls` must be a pydantic model")
    return item


class ToolRegistry:
    """Tools by name; duplicate names are refused."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool) -> None:
        _require_tool(t)
        if t.name in self._tools:
            raise ValueError(f"tool {t.name!r} is already registered")
        self._tools[t.name] = t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def __len__(self) -> int:
        return len(self._tools)


def _require_tool(t: object) -> None:
    """A plain function in ``tools=`` would fail at its first use: refuse it where the agent is made."""
    if not isinstance(t, Tool):
        what = getattr(t, "__qualname__", None) or type(t).__name__
        hint = ": decorate it with @tool (from plexus.llm import tool)" if callable(t) else ""
        raise TypeError(f"tools must be Tool objects made by @tool, got {what!r}{hint}")


def tool_output_blocks(value: Any) -> list[BaseBlock]:
    """A tool's return value as content: blocks as they are, str as text, dicts as data, else JSON text."""
    if isinstance(value, BaseBlock):
        return [value]
    if isinstance(value, list) and all(isinstance(v, BaseBlock) for v in value):
        return list(value)
    if isinstance(value, str):
        return [TextBlock(text=value)]
    if isinstance(value, dict):
        try:
            return [DataBlock(data=value)]
        except ValueError:
            pass
    if value is None:
        return [TextBlock(text="")]
    try:
        return [TextBlock(text=json.dumps(value, default=str))]
    except (TypeError, ValueError) as exc:  # pragma: no cover - default=str makes this rare
        return [ErrorBlock(error_type="ToolOutputError", message=str(exc))]
