"""Request validation: every field a request carries is checked (and canonicalised) before it touches state.

Each helper raises `InvalidRunRequest(verb, problem)` naming the field, so a caller sees what to fix and
the service never stores a value another replica could not read back.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from pydantic import BaseModel, ValidationError

from plexus.core import (
    AgentId,
    ExecutionBudget,
    KernelError,
    Priority,
    RetryPolicy,
    RunId,
    SessionId,
    SpawnBudget,
)
from plexus.runtime.kernel import Subjects, WireError, blocks_from_payload, checkpoint_key, escape_token
from plexus.runtime.orchestration import InvalidRunRequest

__all__ = [
    "check_dispatchable",
    "decode_request",
    "parse_agent",
    "parse_error",
    "parse_model",
    "parse_payload",
    "parse_priority",
    "parse_run_id",
    "parse_session",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

#: Reasons and similar free text are stored in every record; keep them bounded.
MAX_TEXT = 2000


def decode_request(verb: str, data: bytes, kind: type[T]) -> T:
    """Decode a request body; garbage, a non-object or a schema mismatch becomes InvalidRunRequest."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidRunRequest(verb, str(exc)) from None
    except Exception as exc:  # DecodeError, and RecursionError/UnicodeDecodeError/…: all bad input, not 500
        raise InvalidRunRequest(verb, f"the body is not JSON: {type(exc).__name__}: {exc}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "value"
    return f"{where}: {err.get('msg', 'invalid')}"


def parse_agent(verb: str, field: str, text: str) -> AgentId:
    try:
        return AgentId.parse(text)
    except (ValueError, TypeError) as exc:
        detail = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
        raise InvalidRunRequest(verb, f"{field} {text!r} is not an agent id ({detail})") from None


def parse_run_id(verb: str, field: str, value: str) -> str:
    try:
        run_id = str(RunId(value))
    except (ValueError, TypeError) as exc:
        raise InvalidRunRequest(verb, f"{field}: {exc}") from None
    if escape_token(run_id) == "att":
        # `ctr.att.*` are the attempt counters; a tree named "att" would share their subjects.
        raise InvalidRunRequest(verb, f"{field}: 'att' is reserved")
    return run_id


def parse_session(verb: str, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return str(SessionId(value))
    except (ValueError, TypeError) as exc:
        raise InvalidRunRequest(verb, f"session_id: {exc}") from None


#: A fork's lineage: the source run, agent and point; kept on the new root as sent, so it stays small.
_LINEAGE_FIELDS = {"run_id": str, "agent_id": str, "message": int, "turn": int}


def parse_lineage(verb: str, value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A fork's ``forked_from``: the source run and agent (strings) and the point (integers or null)."""
    if value is None:
        return None
    unknown = set(value) - set(_LINEAGE_FIELDS)
    if unknown:
        raise InvalidRunRequest(verb, f"forked_from: unknown fields {sorted(unknown)}")
    for name, kind in _LINEAGE_FIELDS.items():
        field = value.get(name)
        required = name in ("run_id", "agent_id")
        if (field is None and required) or (field is not None and type(field) is not kind):
            raise InvalidRunRequest(verb, f"forked_from.{name}: expected {kind.__name__}, got {field!r}")
    return dict(value)


def parse_model(verb: str, field: str, model: type[M], data: dict[str, Any] | None) -> M | None:
    """Validate a budget/policy JSON object against its plexus.core model."""
    if data is None:
        return None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRunRequest(verb, f"{field}.{_first_error(exc)}") from None


def parse_priority(verb: str, value: int | None) -> int | None:
    if value is None:
        return None
    try:
        return int(Priority(value))
    except ValueError:
        allowed = ", ".join(f"{p.name}={p.value}" for p in Priority)
        raise InvalidRunRequest(verb, f"priority {value!r} is not one of {allowed}") from None


def parse_payload(verb: str, raw: msgspec.Raw) -> bytes:
    """The payload must be a JSON array of content blocks that validate."""
    data = bytes(raw)
    if not data.startswith(b"["):
        raise InvalidRunRequest(verb, "payload must be a JSON array of content blocks")
    try:
        blocks_from_payload(raw)
    except WireError as exc:
        raise InvalidRunRequest(verb, f"payload: {exc.detail}") from None
    except Exception as exc:  # blocks_from_payload turns decode failures into WireError; belt and braces
        raise InvalidRunRequest(verb, f"payload: {type(exc).__name__}: {exc}") from None
    return data


def check_dispatchable(verb: str, prefix: str, agent: AgentId) -> None:
    """Refuse an agent whose inbox, EventLog or checkpoint key cannot be addressed (e.g. a key of 4,000
    characters): stored, such a run could never be dispatched and would be retried forever."""
    subjects = Subjects(prefix=prefix, namespace=agent.namespace)
    try:
        subjects.inbox(agent.type, agent.key)
        subjects.evlog(agent.type, agent.key)
        subjects.progress("run_" + "0" * 26, agent.type, agent.key)
        checkpoint_key(agent.namespace, agent.type, agent.key)
    except ValueError as exc:  # SubjectTooLongError
        raise InvalidRunRequest(verb, f"agent {str(agent)[:100]!r} cannot be addressed: {exc}") from None


def parse_error(verb: str, data: dict[str, Any] | None) -> dict[str, Any] | None:
    """A reported error must be a `KernelError.to_wire()` dict; it is stored in that canonical form."""
    if data is None:
        return None
    # Strict at the service boundary (from_wire itself accepts anything): the shape of a wire error.
    error_type, fields = data.get("error_type"), data.get("fields", {})
    if not isinstance(error_type, str) or not error_type or not isinstance(fields, dict):
        raise InvalidRunRequest(
            verb, "error: not a wire error (a non-empty 'error_type', 'fields' an object)"
        )
    try:
        return KernelError.from_wire(data).to_wire()
    except Exception as exc:  # from_wire is total; to_wire of odd field values may still fail
        raise InvalidRunRequest(verb, f"error: {type(exc).__name__}: {exc}") from None


def parse_text(verb: str, field: str, value: str) -> str:
    if len(value) > MAX_TEXT:
        raise InvalidRunRequest(verb, f"{field} is {len(value)} characters long; the limit is {MAX_TEXT}")
    return value


def budgets(
    verb: str,
    budget: dict[str, Any] | None,
    spawn_budget: dict[str, Any] | None,
    retry: dict[str, Any] | None,
) -> tuple[ExecutionBudget | None, SpawnBudget, RetryPolicy | None]:
    """The three policies of a start request, validated (a missing spawn budget is the default one)."""
    return (
        parse_model(verb, "budget", ExecutionBudget, budget),
        parse_model(verb, "spawn_budget", SpawnBudget, spawn_budget) or SpawnBudget(),
        parse_model(verb, "retry", RetryPolicy, retry),
    )
