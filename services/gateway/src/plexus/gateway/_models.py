"""Request and response bodies of ``/v1`` (pydantic: FastAPI validates them and documents them in OpenAPI)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, WithJsonSchema, field_validator

from plexus.core import AgentId, ContentBlock, ExecutionBudget, Priority, SpawnBudget, registered_block_types

__all__ = [
    "AgentTypeOut",
    "CreateSession",
    "DecisionIn",
    "DecisionOut",
    "MessageIn",
    "MessageOut",
    "RunCreated",
    "RunsPage",
    "SessionOut",
    "SessionRunIn",
    "StartRun",
    "WorkerOut",
]

_NAME = r"^[A-Za-z0-9_\-]{1,128}$"
_PRIORITIES = tuple(int(p) for p in Priority)
#: `AgentId.parse`'s rules: ``type/key`` or ``namespace/type/key`` (the key may hold ``/`` then), names of
#: letters, digits and ``_-.:=``, any key.
_AGENT_NAME = r"[A-Za-z0-9_\-.:=]{1,255}"
_AGENT_ID = rf"^({_AGENT_NAME}/[^/]+|{_AGENT_NAME}/{_AGENT_NAME}/[\s\S]+)$"

#: What the server takes as a content block: an object with a string ``type``. The registered types' own
#: fields are checked too (a 422 names them); any other type is kept as it is (`UnknownBlock`).
Block = Annotated[
    ContentBlock,
    WithJsonSchema(
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string"}},
            "additionalProperties": True,
            "description": "a content block; the fields of the registered types ("
            + ", ".join(sorted(registered_block_types()))
            + ") are validated, other types are kept as they are",
        }
    ),
]


def _json_kinds(schema: dict[str, Any]) -> set[str]:
    options = schema.get("anyOf", [schema])
    return {str(o["type"]) for o in options if isinstance(o, dict) and "type" in o}


def _as_documented(model: type[BaseModel]) -> Callable[[Any], Any]:
    """A check of a JSON object for ``model`` by the JSON types its schema documents, before pydantic: a
    boolean or a string is not a number, a number not a boolean, and ``3.0`` is the integer 3 (plexus.core's
    models are lax about the first and strict about the last)."""
    kinds = {name: _json_kinds(field) for name, field in model.model_json_schema()["properties"].items()}

    def check(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        fixed = dict(value)
        for key, item in value.items():
            allowed = kinds.get(key)
            if allowed is None or item is None:
                continue  # an unknown field is refused by the model itself
            if isinstance(item, bool) or not isinstance(item, int | float):
                kind = "boolean" if isinstance(item, bool) else "string" if isinstance(item, str) else None
                if kind is not None and kind not in allowed:
                    raise ValueError(f"{key} must be {' or '.join(sorted(allowed))}, not a {kind}")
            elif not allowed & {"integer", "number"}:
                raise ValueError(f"{key} must be {' or '.join(sorted(allowed))}, not a number")
            elif isinstance(item, float) and item.is_integer() and "number" not in allowed:
                fixed[key] = int(item)
        return fixed

    return check


Budget = Annotated[ExecutionBudget | None, BeforeValidator(_as_documented(ExecutionBudget))]
Spawn = Annotated[SpawnBudget | None, BeforeValidator(_as_documented(SpawnBudget))]


class _Strict(BaseModel):
    # strict: JSON `false` is not the integer 0, nor `1` a boolean (what the schema says is what is taken).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _RunRequest(_Strict):
    """What starts run trees (a run now, a schedule's runs later): its root agent and priority."""

    @field_validator("agent_id", check_fields=False)
    @classmethod
    def _agent(cls, value: str) -> str:
        AgentId.parse(value)  # ValueError names the problem
        return value

    @field_validator("priority", check_fields=False)
    @classmethod
    def _priority(cls, value: int) -> int:
        if value not in _PRIORITIES:
            raise ValueError(f"priority must be one of {_PRIORITIES}")
        return value


class StartRun(_RunRequest):
    """Start a run tree rooted at ``agent_id`` (``[namespace/]type/key``)."""

    agent_id: str = Field(min_length=3, max_length=512, pattern=_AGENT_ID, examples=["researcher/topic-1"])
    input: list[Block] = Field(max_length=1000, examples=[[{"type": "text", "text": "hello"}]])
    budget: Budget = None
    spawn_budget: Spawn = None
    priority: int = Field(
        default=int(Priority.NORMAL),
        description=f"one of {_PRIORITIES}",
        json_schema_extra={"enum": list(_PRIORITIES)},
    )
    run_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=_NAME, description="idempotency key"
    )


class RunCreated(BaseModel):
    run_id: str
    events: str = Field(description="the SSE URL of the run tree")


class RunsPage(BaseModel):
    runs: list[dict[str, Any]]
    next_cursor: str | None = None


class MessageIn(_Strict):
    input: list[Block] = Field(max_length=1000)
    timeout_s: float = Field(default=30.0, gt=0, le=300, allow_inf_nan=False)


class MessageOut(BaseModel):
    agent_id: str
    output: list[dict[str, JsonValue]]


class DecisionIn(_Strict):
    approved: bool = Field(default=True, strict=True)
    reason: str = Field(default="", max_length=500)
    #: ``fields.calls[*].suspension`` of the 409 ApprovalRequired: the wait the decision is for.
    suspension: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="the suspension the decision is for (from the ApprovalRequired problem's calls); "
        "without it, whichever waits for the call id when the agent reads the decision",
    )
    wait: bool = Field(
        default=False,
        strict=True,
        description="answer with the resumed agent's reply (or its typed error) instead of once stored",
    )
    timeout_s: float = Field(default=30.0, gt=0, le=300, allow_inf_nan=False)
    decided_by: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="who decided, recorded with the decision (default: the bearer token's name)",
    )


class DecisionOut(BaseModel):
    agent_id: str
    call_id: str
    approved: bool
    #: With ``wait``: the agent's reply once the loop resumed and finished; else null (stored, not handled).
    output: list[dict[str, JsonValue]] | None = None


class WorkerOut(BaseModel):
    worker_id: str
    types: list[str]
    partitions: dict[str, list[int]] = {}
    detail: dict[str, Any] = {}


class AgentTypeOut(BaseModel):
    namespace: str
    type: str
    description: str = ""
    capabilities: list[str] = []
    workers: list[str] = []


class CreateSession(_Strict):
    agent_type: str = Field(pattern=_NAME, examples=["assistant"])
    parent_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=_NAME)
    title: str | None = Field(default=None, max_length=256)


class SessionRunIn(_Strict):
    input: list[Block] = Field(min_length=1, max_length=1000)
    budget: Budget = None


class SessionOut(BaseModel):
    session: dict[str, Any]
    transcript: list[dict[str, Any]]
    memory_keys: list[str]
    children: list[str] = []
    runs: list[str] = []
