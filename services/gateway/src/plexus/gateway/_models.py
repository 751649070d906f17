"""Request and response bodies of ``/v1`` (pydantic: FastAPI validates them and documents them in OpenAPI)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from plexus.core import AgentId, ContentBlock, ExecutionBudget, Priority, SpawnBudget

__all__ = [
    "AgentTypeOut",
    "CreateSession",
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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StartRun(_Strict):
    """Start a run tree rooted at ``agent_id`` (``[namespace/]type/key``)."""

    agent_id: str = Field(min_length=3, max_length=512, examples=["researcher/topic-1"])
    input: list[ContentBlock] = Field(max_length=1000, examples=[[{"type": "text", "text": "hello"}]])
    budget: ExecutionBudget | None = None
    spawn_budget: SpawnBudget | None = None
    priority: int = Field(default=int(Priority.NORMAL), description=f"one of {_PRIORITIES}")
    run_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=_NAME, description="idempotency key"
    )

    @field_validator("agent_id")
    @classmethod
    def _agent(cls, value: str) -> str:
        AgentId.parse(value)  # ValueError names the problem
        return value

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: int) -> int:
        if value not in _PRIORITIES:
            raise ValueError(f"priority must be one of {_PRIORITIES}")
        return value


class RunCreated(BaseModel):
    run_id: str
    events: str = Field(description="the SSE URL of the run tree")


class RunsPage(BaseModel):
    runs: list[dict[str, Any]]
    next_cursor: str | None = None


class MessageIn(_Strict):
    input: list[ContentBlock] = Field(max_length=1000)
    timeout_s: float = Field(default=30.0, gt=0, le=300, allow_inf_nan=False)


class MessageOut(BaseModel):
    agent_id: str
    output: list[dict[str, JsonValue]]


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
    input: list[ContentBlock] = Field(min_length=1, max_length=1000)
    budget: ExecutionBudget | None = None


class SessionOut(BaseModel):
    session: dict[str, Any]
    transcript: list[dict[str, Any]]
    memory_keys: list[str]
    children: list[str] = []
    runs: list[str] = []
