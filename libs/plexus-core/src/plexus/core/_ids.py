"""Typed identifiers: one `str` subclass per kind of id, so mypy refuses a `RunId` where a `SessionId` is due.

Minted ids read ``<prefix>_<ULID>`` (``run_01JD3W...``): the prefix says what the id names when it shows up in
a log line, and the ULID sorts by creation time.

Foreign ids are accepted. Session ids come from users, tool-call ids from providers (``call_abc``,
``toolu_01...``), message ids from other systems, so every kind takes any opaque string that is non-empty, at
most 256 characters, and free of whitespace and control characters. One thing is refused: a value that is
exactly a *minted id of another kind* (``run_<ULID>`` offered as a `SessionId`). That catches ids crossed
after a trip through JSON, where mypy can no longer see them.

Ids are not escaped for NATS subjects; a foreign id may hold ``.``, ``*`` or ``>``, so the runtime has to
encode it before it puts the id in a subject.
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar, Self

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema
from ulid import ULID

from ._ulids import mint_ulid

__all__ = [
    "ID_MAX_LENGTH",
    "ApprovalId",
    "ArtifactId",
    "MessageId",
    "PartId",
    "ProviderMessageId",
    "RunId",
    "SessionId",
    "TaskId",
    "ToolCallId",
    "TurnId",
    "TypedId",
    "parsed_run_id",
]

ID_MAX_LENGTH = 256

# Crockford base32 as python-ulid writes it: 26 upper-case characters, no I, L, O or U.
_ULID_BODY = r"[0-7][0-9A-HJKMNP-TV-Z]{25}"
_MINTED_RE = re.compile(rf"^([a-z]+)_({_ULID_BODY})\Z")
_BAD_CHAR_RE = re.compile(r"[\s\x00-\x1f\x7f]")

# prefix -> id class; filled by __init_subclass__ so a prefix cannot be claimed twice.
_PREFIXES: dict[str, type[TypedId]] = {}


class TypedId(str):
    """Base of every typed id. Subclasses set `prefix`; the base is abstract and has no prefix."""

    __slots__ = ()
    prefix: ClassVar[str] = ""
    _own_minted: ClassVar[re.Pattern[str]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not re.fullmatch(r"[a-z]+", cls.prefix):
            raise TypeError(f"{cls.__name__}.prefix must be lower-case letters, got {cls.prefix!r}")
        owner = _PREFIXES.setdefault(cls.prefix, cls)
        if owner is not cls:
            raise TypeError(f"prefix {cls.prefix!r} of {cls.__name__} is already used by {owner.__name__}")
        cls._own_minted = re.compile(rf"{cls.prefix}_{_ULID_BODY}\Z")

    def __new__(cls, value: str) -> Self:
        if cls is TypedId:
            raise TypeError("TypedId is abstract; use a concrete id type such as RunId")
        if type(value) is cls:  # already validated
            return value
        return super().__new__(cls, cls._validate(value))

    @classmethod
    def _validate(cls, value: object) -> str:
        # The common case first: an id of this kind as `new` mints it is valid as it stands (every id of a
        # message is checked when a worker takes it in).
        if type(value) is str and cls._own_minted.match(value) is not None:
            return value
        name = cls.__name__
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {type(value).__name__}")
        if value == "":
            raise ValueError(f"{name} must not be empty")
        if len(value) > ID_MAX_LENGTH:
            raise ValueError(f"{name} is {len(value)} characters long; the limit is {ID_MAX_LENGTH}")
        bad = _BAD_CHAR_RE.search(value)
        if bad is not None:
            raise ValueError(
                f"{name} {value!r} contains whitespace or a control character "
                f"({bad.group()!r} at index {bad.start()})"
            )
        minted = _MINTED_RE.match(value)
        if minted is not None:
            owner = _PREFIXES.get(minted.group(1))
            if owner is not None and owner is not cls:
                raise ValueError(
                    f"{value!r} is a {owner.__name__} (prefix {owner.prefix + '_'!r}), not a {name} "
                    f"(prefix {cls.prefix + '_'!r})"
                )
        return value

    @classmethod
    def new(cls) -> Self:
        """Mint a fresh ``<prefix>_<ULID>`` id."""
        if cls is TypedId:
            raise TypeError("TypedId is abstract; use a concrete id type such as RunId")
        # Valid by construction (the prefix was checked by __init_subclass__, the body is a minted ULID),
        # so it skips `_validate`: re-reading an id just minted cost a third of minting it.
        return str.__new__(cls, f"{cls.prefix}_{mint_ulid()}")

    @classmethod
    def parse(cls, value: str) -> Self:
        """Validate `value` (rules in the module docstring); bad input raises ValueError saying why."""
        return cls(value)

    @property
    def ulid(self) -> ULID | None:
        """The ULID of an id minted by `new` (creation time: ``.ulid.datetime``); None for a foreign id."""
        minted = _MINTED_RE.match(self)
        if minted is None or minted.group(1) != self.prefix:
            return None
        return ULID.from_str(minted.group(2))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str.__repr__(self)})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # Validate from any str (JSON or Python), store the typed instance, dump as a plain string.
        return core_schema.no_info_after_validator_function(
            cls.parse,
            core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str, when_used="always"),
        )


class SessionId(TypedId):
    """A conversation that outlives single runs; often supplied by the user."""

    __slots__ = ()
    prefix = "ses"


class RunId(TypedId):
    """One execution of one agent; a run tree shares its root's `RunId` as ``root_id``."""

    __slots__ = ()
    prefix = "run"


class TurnId(TypedId):
    """One model round trip inside a run."""

    __slots__ = ()
    prefix = "turn"


class MessageId(TypedId):
    """One transcript item / kernel message."""

    __slots__ = ()
    prefix = "msg"


class ToolCallId(TypedId):
    """Correlates a tool call with its result; usually the provider's own id (``call_...``, ``toolu_...``)."""

    __slots__ = ()
    prefix = "call"


class TaskId(TypedId):
    """A unit of queued or background work."""

    __slots__ = ()
    prefix = "task"


class ApprovalId(TypedId):
    """A pending human-approval request."""

    __slots__ = ()
    prefix = "apv"


class ArtifactId(TypedId):
    """Content held in an artifact store (a `DataRef` handle)."""

    __slots__ = ()
    prefix = "art"


class PartId(TypedId):
    """One content part inside a message."""

    __slots__ = ()
    prefix = "part"


class ProviderMessageId(TypedId):
    """The id a provider gave its response (``msg_...``, ``chatcmpl-...``); `new` is for fakes and tests."""

    __slots__ = ()
    prefix = "pmsg"


#: Run ids parsed recently (the EventLog entries a worker writes and the progress events of a run repeat
#: their run's id). Failures are not cached; `forget_parsed_ids` empties it.
parsed_run_id = functools.lru_cache(maxsize=2048)(RunId.parse)
