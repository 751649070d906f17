"""Routing addresses: `AgentId` (point-to-point) and `TopicId` (pub/sub).

String forms follow seed 000: ``[namespace/]type/key`` and ``[namespace/]type/source``. The namespace is
omitted when it is ``default`` *and* the key has no ``/`` — keys may contain any character, so when a key
holds a ``/`` the namespace is always written, which keeps parsing unambiguous (``split("/", 2)``).
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from ._ids import parsed_run_id

__all__ = ["DEFAULT_NAMESPACE", "AgentId", "TopicId", "forget_parsed_ids"]

DEFAULT_NAMESPACE = "default"

# Types and namespaces are names chosen by developers; keys and sources are data (session ids, URLs,
# user input) and may hold anything but must not be empty. AutoGen's type rule plus ':' and '='.
_NAME_RE = re.compile(r"^[\w\-.:=]+\Z")
_NAME_MAX = 255


def _check_name(what: str, value: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > _NAME_MAX:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {_NAME_MAX}")
    if not _NAME_RE.match(value):
        bad = sorted({c for c in value if not re.match(r"[\w\-.:=]", c)})
        raise ValueError(
            f"{what} {value!r} contains {''.join(bad)!r}; "
            "allowed are letters, digits, '_', '-', '.', ':', '='"
        )
    return value


def _check_data(what: str, value: str) -> str:
    if value == "":
        raise ValueError(f"{what} must not be empty")
    return value


def _split(text: str, second: str) -> tuple[str, str, str]:
    """Split ``[namespace/]type/<second>`` into its three parts or say what is wrong."""
    if not isinstance(text, str):
        raise TypeError(f"expected a string like 'type/{second}', got {type(text).__name__}")
    parts = text.split("/", 2)
    if len(parts) == 2:
        return DEFAULT_NAMESPACE, parts[0], parts[1]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    raise ValueError(f"{text!r} has no '/': expected '[namespace/]type/{second}'")


class _Address(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    _second: ClassVar[str]

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        # Accept the string form wherever a model is expected (JSON payloads, CLI arguments).
        if isinstance(data, str):
            namespace, type_, second = _split(data, cls._second)
            return {"namespace": namespace, "type": type_, cls._second: second}
        return data

    def _format(self, second: str) -> str:
        namespace: str = getattr(self, "namespace")  # noqa: B009 - declared on subclasses
        type_: str = getattr(self, "type")  # noqa: B009
        if namespace == DEFAULT_NAMESPACE and "/" not in second:
            return f"{type_}/{second}"
        return f"{namespace}/{type_}/{second}"


class AgentId(_Address):
    """Point-to-point address of one agent instance: ``AgentId("react", "sess-123")`` → ``react/sess-123``."""

    _second: ClassVar[str] = "key"

    type: str
    key: str
    namespace: str = DEFAULT_NAMESPACE

    def __init__(self, type: str, key: str, namespace: str = DEFAULT_NAMESPACE, **data: Any) -> None:
        super().__init__(**{"type": type, "key": key, "namespace": namespace, **data})

    @field_validator("type")
    @classmethod
    def _v_type(cls, v: str) -> str:
        return _check_name("agent type", v)

    @field_validator("namespace")
    @classmethod
    def _v_ns(cls, v: str) -> str:
        return _check_name("namespace", v)

    @field_validator("key")
    @classmethod
    def _v_key(cls, v: str) -> str:
        return _check_data("agent key", v)

    @classmethod
    def parse(cls, text: str) -> AgentId:
        """Parse ``[namespace/]type/key``; malformed text raises ValueError naming the problem."""
        if cls is AgentId and isinstance(text, str):
            return _parse_agent_id(text)  # hot path: every message names its target
        namespace, type_, key = _split(text, "key")
        return cls(type_, key, namespace)

    def __str__(self) -> str:
        return self._format(self.key)


class TopicId(_Address):
    """Pub/sub channel: ``TopicId("agent.progress", run_id)`` → ``agent.progress/<run_id>``."""

    _second: ClassVar[str] = "source"

    type: str
    source: str = DEFAULT_NAMESPACE
    namespace: str = DEFAULT_NAMESPACE

    def __init__(
        self, type: str, source: str = DEFAULT_NAMESPACE, namespace: str = DEFAULT_NAMESPACE, **data: Any
    ) -> None:
        super().__init__(**{"type": type, "source": source, "namespace": namespace, **data})

    @field_validator("type")
    @classmethod
    def _v_type(cls, v: str) -> str:
        return _check_name("topic type", v)

    @field_validator("namespace")
    @classmethod
    def _v_ns(cls, v: str) -> str:
        return _check_name("namespace", v)

    @field_validator("source")
    @classmethod
    def _v_source(cls, v: str) -> str:
        return _check_data("topic source", v)

    @classmethod
    def parse(cls, text: str) -> TopicId:
        """Parse ``[namespace/]type/source``; malformed text raises ValueError naming the problem."""
        if cls is TopicId and isinstance(text, str):
            return _parse_topic_id(text)
        namespace, type_, source = _split(text, "source")
        return cls(type_, source, namespace)

    def __str__(self) -> str:
        return self._format(self.source)


# Ids are frozen values, so a parsed id can be shared: a worker parses the same few targets over and over.
# Failures are not cached (lru_cache does not keep exceptions), so bad text is rejected every time.
@functools.lru_cache(maxsize=8192)
def _parse_agent_id(text: str) -> AgentId:
    namespace, type_, key = _split(text, "key")
    return AgentId(type_, key, namespace)


@functools.lru_cache(maxsize=2048)
def _parse_topic_id(text: str) -> TopicId:
    namespace, type_, source = _split(text, "source")
    return TopicId(type_, source, namespace)


def forget_parsed_ids() -> None:
    """Empty the caches of parsed agent, topic and run ids (they refill as ids are parsed again).

    For a process that has just let go of many agents: each cache keeps the last few thousand distinct ids,
    and after a burst of new keys those are the burst's, allocated among its objects, so the small-object
    allocator cannot give the memory those objects used back to the system while they live."""
    _parse_agent_id.cache_clear()
    _parse_topic_id.cache_clear()
    parsed_run_id.cache_clear()
