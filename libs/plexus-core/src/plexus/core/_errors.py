"""The KernelError tree (seed 000) plus the transcript errors of seed 002.

Every error knows its own fields, so a failure raised in one process is re-raised in another as the same
class with the same fields (`to_wire` / `KernelError.from_wire`), or carried inside a payload as an
`ErrorBlock` (`to_block` / `KernelError.from_block`). The error types of the other Plexus packages are
rebuilt even where their package was never imported (`_error_homes`). Unknown error types from newer peers
become `RemoteKernelError`, which keeps the type name and fields instead of flattening them to a string.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ._error_homes import import_error_packages

if TYPE_CHECKING:
    from ._content import ErrorBlock

__all__ = [
    "WIRE_ERROR_VERSION",
    "AgentCrashError",
    "AgentNotFoundError",
    "BudgetExhaustedError",
    "CancellationError",
    "ConcurrentAppendError",
    "HandlerError",
    "KernelError",
    "MiddlewareTermination",
    "NormalizeError",
    "PermissionDeniedError",
    "ProtocolError",
    "RemoteKernelError",
    "ReplyTimeoutError",
    "SpawnDenied",
]

WIRE_ERROR_VERSION = 1

_REGISTRY: dict[str, type[KernelError]] = {}


class KernelError(Exception):
    """Base of every Plexus failure. Subclasses declare `fields`, the constructor arguments that travel."""

    fields: ClassVar[tuple[str, ...]] = ("message",)
    #: Whether retrying the same work may succeed; copied into `ErrorBlock.recoverable`. A class default that
    #: an instance may narrow (an agent type that was never registered will not appear on a retry).
    recoverable: bool = False

    def __init__(self, message: str = "") -> None:
        self.message = message
        super().__init__(message)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__name__ in _REGISTRY:
            raise TypeError(f"a KernelError named {cls.__name__!r} is already registered")
        _REGISTRY[cls.__name__] = cls

    @property
    def error_type(self) -> str:
        return type(self).__name__

    def field_values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.fields}

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.field_values().items())
        return f"{self.error_type}({args})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, KernelError)
            and other.error_type == self.error_type
            and other.field_values() == self.field_values()
        )

    def __hash__(self) -> int:
        return hash((self.error_type, repr(sorted(self.field_values().items()))))

    # -- wire -----------------------------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"v", "error_type", "message", "fields"}``."""
        return {
            "v": WIRE_ERROR_VERSION,
            "error_type": self.error_type,
            "message": str(self),
            "fields": self.field_values(),
        }

    @classmethod
    def _from_fields(cls, fields: dict[str, Any]) -> KernelError:
        return cls(**fields)

    @staticmethod
    def from_wire(data: Any) -> KernelError:
        """Rebuild the error `to_wire` produced. Never raises: an error off the wire is someone else's bytes.

        Unknown types become `RemoteKernelError` with their fields. What cannot be rebuilt (not an object,
        no usable ``error_type``, fields another version of the class does not accept or that fail its
        validation) becomes a `RemoteKernelError` too, keeping everything received and why it failed
        (``_decode_error``; the raw value under ``_wire`` when it was not even an error object).
        """
        if not isinstance(data, dict):
            return _unbuildable("KernelError", "", {"_wire": data}, "an error on the wire must be an object")
        error_type = data.get("error_type")
        message = str(data.get("message", ""))
        if not isinstance(error_type, str) or not error_type:
            problem = "an error on the wire needs a non-empty string 'error_type'"
            return _unbuildable("KernelError", message, {"_wire": dict(data)}, problem)
        fields = data.get("fields", {})
        if not isinstance(fields, dict):
            problem = f"'fields' of {error_type} must be an object"
            return _unbuildable(error_type, message, {"_wire": dict(data)}, problem)
        cls = _REGISTRY.get(error_type)
        if cls is None and import_error_packages():  # an error of a Plexus package never imported here
            cls = _REGISTRY.get(error_type)
        if cls is None or cls is RemoteKernelError:
            return RemoteKernelError(error_type, message, dict(fields))
        try:
            return cls._from_fields(dict(fields))
        except Exception as exc:  # fields of another version, or values its checks refuse: keep them all
            return _unbuildable(error_type, message, dict(fields), f"{type(exc).__name__}: {exc}")

    def to_block(self) -> ErrorBlock:
        from ._content import ErrorBlock  # local: _content is a sibling that may import error helpers

        return ErrorBlock(
            error_type=self.error_type,
            message=str(self),
            recoverable=self.recoverable,
            details=_jsonable(self.field_values()),
        )

    @staticmethod
    def from_block(block: ErrorBlock) -> KernelError:
        return KernelError.from_wire(
            {"error_type": block.error_type, "message": block.message, "fields": dict(block.details)}
        )


def _unbuildable(error_type: str, message: str, fields: dict[str, Any], problem: str) -> KernelError:
    return RemoteKernelError(error_type, message, {**fields, "_decode_error": problem})


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if hasattr(value, "model_dump"):
            out[key] = value.model_dump(mode="json")
        else:
            out[key] = value
    return out


#: How many registered types an `AgentNotFoundError` names (a cluster may register hundreds).
_KNOWN_TYPES_SHOWN = 20
_START_A_WORKER = "start a worker that hosts it (`plexus worker <module>:<app>`)"


class AgentNotFoundError(KernelError):
    """A message was routed to an AgentId whose type no live worker hosts.

    `registered` says which mistake it is: False, the registry has never seen the type (raised at once,
    with `known_types` of the namespace and the closest of them as `suggestion`); True, the type is
    registered but no live worker hosted it within the grace period; None, not known (an older peer).
    """

    fields = ("agent_id", "registered", "known_types", "suggestion")
    recoverable = True

    def __init__(
        self,
        agent_id: Any,
        registered: bool | None = None,
        known_types: Sequence[str] = (),
        suggestion: str | None = None,
    ) -> None:
        self.agent_id = str(agent_id)
        self.registered = registered
        self.known_types = sorted(known_types)[:_KNOWN_TYPES_SHOWN]
        self.suggestion = suggestion
        # A misspelt type stays misspelt: retrying it only delays the error the caller must fix.
        self.recoverable = registered is not False
        super().__init__(self._describe())

    @classmethod
    def unregistered(cls, agent_id: Any, agent_type: str, known_types: Sequence[str]) -> AgentNotFoundError:
        """The error for a type the registry has never seen, suggesting the closest of `known_types`."""
        close = difflib.get_close_matches(agent_type, list(known_types), n=1)
        return cls(
            agent_id, registered=False, known_types=known_types, suggestion=close[0] if close else None
        )

    def _describe(self) -> str:
        if self.registered is None:
            return f"No worker hosts agent {self.agent_id}"
        if self.registered:
            return (
                f"No worker hosts agent {self.agent_id}: its type is registered, but no live worker hosted it"
                f" in time (one may be starting or restarting); {_START_A_WORKER}"
            )
        hint = f"did you mean {self.suggestion}? " if self.suggestion else ""
        known = ", ".join(self.known_types) if self.known_types else "none"
        return (
            f"No agent type is registered for agent {self.agent_id}; {hint}registered types: {known}; "
            f"{_START_A_WORKER}"
        )


class HandlerError(KernelError):
    """An agent's handler raised. `cause` describes the original exception, `cause_type` names its class."""

    fields = ("cause", "cause_type", "agent_id")

    def __init__(self, cause: str, cause_type: str = "Exception", agent_id: str | None = None) -> None:
        self.cause = cause
        self.cause_type = cause_type
        self.agent_id = agent_id
        where = f" in {agent_id}" if agent_id else ""
        super().__init__(f"Handler failed{where}: {cause_type}: {cause}")


class AgentCrashError(KernelError):
    """The worker running an agent died or lost its lease mid-handler; the orchestrator may retry."""

    fields = ("run_id", "agent_id")
    recoverable = True

    def __init__(self, run_id: str | None, agent_id: Any) -> None:
        self.run_id = run_id
        self.agent_id = str(agent_id)
        super().__init__(f"Agent {self.agent_id} crashed (run {run_id})")


_DIMENSION_LABEL = {"tokens": "Token", "cost": "Cost", "turns": "Turn", "deadline": "Deadline"}


class BudgetExhaustedError(KernelError):
    """A run tree crossed its ExecutionBudget: ``Token budget exceeded: 4200 > 4000``."""

    fields = ("dimension", "used", "limit")

    def __init__(self, dimension: str, used: float, limit: float) -> None:
        self.dimension = dimension
        self.used = used
        self.limit = limit
        label = _DIMENSION_LABEL.get(dimension, dimension.capitalize())
        super().__init__(f"{label} budget exceeded: {_num(used)} > {_num(limit)}")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class MiddlewareTermination(KernelError):
    """A middleware guard ended the run on purpose (status ``guardrail_tripped``); never retried."""

    fields = ("message",)


class CancellationError(KernelError):
    """Cooperative cancellation fired or a deadline passed."""

    fields = ("reason",)

    def __init__(self, reason: str = "cancelled") -> None:
        self.reason = reason
        super().__init__(f"Cancelled: {reason}")


class ConcurrentAppendError(KernelError):
    """Another writer appended to the EventLog first; reload `last_seq` and retry."""

    fields = ("expected_seq", "actual_seq")
    recoverable = True

    def __init__(self, expected_seq: int, actual_seq: int | None) -> None:
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq
        actual = "unknown" if actual_seq is None else str(actual_seq)
        super().__init__(f"EventLog moved: expected last seq {expected_seq}, found {actual}")


class SpawnDenied(KernelError):
    """Spawning a child would exceed the tree's SpawnBudget."""

    fields = ("parent_run", "budget")

    def __init__(self, parent_run: str, budget: Any) -> None:
        self.parent_run = str(parent_run)
        # Accept a SpawnBudget or its JSON form; keep the JSON form so the error stays a plain value.
        self.budget: dict[str, Any] = (
            budget.model_dump(mode="json") if hasattr(budget, "model_dump") else budget
        )
        limit = self.budget.get("max_agents") if isinstance(self.budget, dict) else self.budget
        super().__init__(f"Spawn denied for run {self.parent_run}: spawn budget of {limit} agents exhausted")


class ReplyTimeoutError(KernelError, TimeoutError):
    """No reply arrived before the caller's deadline (the target may still be working or may have died)."""

    fields = ("agent_id", "message_id", "timeout_s")
    recoverable = True

    def __init__(self, agent_id: Any, message_id: str, timeout_s: float) -> None:
        self.agent_id = str(agent_id)
        self.message_id = message_id
        self.timeout_s = timeout_s
        KernelError.__init__(self, f"No reply from {self.agent_id} to {message_id} within {_num(timeout_s)}s")


class ProtocolError(KernelError):
    """The transcript or a peer reached an invalid state (e.g. a tool result with no matching call)."""

    fields = ("message",)


class NormalizeError(KernelError):
    """Content cannot be projected into the Plexus model (e.g. an unsupported media type)."""

    fields = ("message",)


class PermissionDeniedError(KernelError):
    """The NATS server refused this identity an operation on a subject (its role lacks the permission): a
    configuration error, never an outage to wait out."""

    fields = ("subject", "operation", "user")

    def __init__(self, subject: str, operation: str, user: str) -> None:
        self.subject = subject
        self.operation = operation
        self.user = user
        super().__init__(f"user {user!r} may not {operation} {subject!r} (its role lacks this permission)")


class RemoteKernelError(KernelError):
    """An error type this process does not know; keeps the remote type name and fields intact."""

    fields = ("remote_type", "remote_message", "remote_fields")

    def __init__(self, remote_type: str, remote_message: str, remote_fields: dict[str, Any]) -> None:
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_fields = remote_fields
        super().__init__(remote_message)

    @property
    def error_type(self) -> str:
        return self.remote_type

    def field_values(self) -> dict[str, Any]:
        return dict(self.remote_fields)

    def to_wire(self) -> dict[str, Any]:
        # Re-serialises as the original type so a relay hop does not rename the error.
        return {
            "v": WIRE_ERROR_VERSION,
            "error_type": self.remote_type,
            "message": self.remote_message,
            "fields": dict(self.remote_fields),
        }
