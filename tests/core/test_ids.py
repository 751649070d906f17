"""Typed ids: minting, parsing rules, pydantic round trips, and mypy refusing crossed ids."""

from __future__ import annotations

import copy
import pickle
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mypy import api as mypy_api
from pydantic import BaseModel, ValidationError
from ulid import ULID

from plexus.core._ids import (
    ID_MAX_LENGTH,
    ApprovalId,
    ArtifactId,
    MessageId,
    PartId,
    ProviderMessageId,
    RunId,
    SessionId,
    TaskId,
    ToolCallId,
    TurnId,
    TypedId,
)

ALL_IDS: list[type[TypedId]] = [
    SessionId,
    RunId,
    TurnId,
    MessageId,
    ToolCallId,
    TaskId,
    ApprovalId,
    ArtifactId,
    PartId,
    ProviderMessageId,
]

# Opaque ids as other systems write them: no whitespace, no control characters.
foreign_ids = st.text(
    alphabet=st.characters(exclude_categories=["Cs", "Zs", "Zl", "Zp", "Cc"]), min_size=1, max_size=64
).filter(lambda s: not s.isspace() and not any(c.isspace() for c in s))


@pytest.mark.parametrize("cls", ALL_IDS)
def test_new_mints_prefixed_ulid(cls: type[TypedId]) -> None:
    value = cls.new()
    assert type(value) is cls
    prefix, _, body = value.partition("_")
    assert prefix == cls.prefix
    assert ULID.from_str(body) == value.ulid
    assert cls.new() != value


def test_prefixes_are_distinct_and_readable() -> None:
    prefixes = [cls.prefix for cls in ALL_IDS]
    assert len(set(prefixes)) == len(prefixes)
    assert RunId.new().startswith("run_")
    assert SessionId.new().startswith("ses_")


def test_minted_ids_sort_by_creation_time() -> None:
    first = TaskId.new()
    second = TaskId.new()
    assert first.ulid is not None
    assert second.ulid is not None
    assert first.ulid.milliseconds <= second.ulid.milliseconds


@pytest.mark.parametrize("cls", ALL_IDS)
@given(value=foreign_ids)
def test_foreign_strings_are_accepted_as_is(cls: type[TypedId], value: str) -> None:
    parsed = cls.parse(value)
    assert parsed == value
    assert type(parsed) is cls


@pytest.mark.parametrize(
    "value", ["user-chat-42", "call_abc123XYZ", "toolu_01A09q90qw90lq917835lq9", "chatcmpl-9xYz", "a.b>c"]
)
def test_real_world_foreign_ids(value: str) -> None:
    assert ToolCallId.parse(value) == value
    assert SessionId.parse(value).ulid is None  # foreign: no ULID to speak of


def test_anthropic_message_id_is_not_mistaken_for_a_minted_message_id() -> None:
    # "msg_" + 24 base62 characters is Anthropic's format, not "msg_" + a ULID.
    assert ProviderMessageId.parse("msg_01XFDUDYJgAACzvnptvVoYEL") == "msg_01XFDUDYJgAACzvnptvVoYEL"


def test_empty_is_rejected() -> None:
    with pytest.raises(ValueError, match="RunId must not be empty"):
        RunId.parse("")


@pytest.mark.parametrize("value", [" run", "run ", "a b", "a\tb", "line\n", "nul\x00", "del\x7f", "\u00a0x"])
def test_whitespace_and_control_characters_are_rejected(value: str) -> None:
    with pytest.raises(ValueError, match="whitespace or a control character"):
        SessionId.parse(value)


def test_too_long_is_rejected() -> None:
    assert len(TaskId.parse("x" * ID_MAX_LENGTH)) == ID_MAX_LENGTH
    with pytest.raises(ValueError, match=f"257 characters long; the limit is {ID_MAX_LENGTH}"):
        TaskId.parse("x" * (ID_MAX_LENGTH + 1))


def test_non_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="RunId must be a string, got int"):
        RunId(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", ALL_IDS)
@pytest.mark.parametrize("other", ALL_IDS)
def test_minted_id_of_another_kind_is_rejected(cls: type[TypedId], other: type[TypedId]) -> None:
    minted = other.new()
    if cls is other:
        assert cls.parse(str(minted)) == minted
        return
    with pytest.raises(
        ValueError, match=rf"is a {other.__name__} \(prefix '{other.prefix}_'\), not a {cls.__name__}"
    ):
        cls.parse(str(minted))


def test_own_prefix_with_a_non_ulid_tail_counts_as_foreign() -> None:
    # Consistent with "foreign strings are accepted": only an exact <prefix>_<ULID> is recognised as minted.
    value = RunId.parse("ses_not-a-ulid")
    assert value == "ses_not-a-ulid"
    assert value.ulid is None
    assert RunId.parse("run_short").ulid is None


def test_typed_id_base_is_abstract_and_prefixes_are_unique() -> None:
    with pytest.raises(TypeError, match="abstract"):
        TypedId("x")
    with pytest.raises(TypeError, match="already used by RunId"):

        class _Clash(TypedId):  # pyright: ignore[reportUnusedClass]
            prefix = "run"

    with pytest.raises(TypeError, match="lower-case letters"):

        class _Bad(TypedId):  # pyright: ignore[reportUnusedClass]
            prefix = "Bad-"


@pytest.mark.parametrize("cls", ALL_IDS)
def test_ids_are_plain_strings_that_pickle_and_copy(cls: type[TypedId]) -> None:
    value = cls.new()
    assert isinstance(value, str)
    assert str(value) == value
    assert hash(value) == hash(str(value))
    assert repr(value) == f"{cls.__name__}('{value}')"
    for clone in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
        assert clone == value
        assert type(clone) is cls


def test_constructing_from_the_same_type_returns_it_unchanged() -> None:
    value = RunId.new()
    assert RunId(value) is value


class _Envelope(BaseModel):
    run_id: RunId
    session_id: SessionId | None = None
    calls: list[ToolCallId] = []


def test_pydantic_field_validates_and_serialises_as_string() -> None:
    run = RunId.new()
    env = _Envelope.model_validate(
        {"run_id": run, "session_id": "user-42", "calls": ["call_1", ToolCallId.new()]}
    )
    assert type(env.run_id) is RunId
    assert type(env.session_id) is SessionId
    assert all(type(c) is ToolCallId for c in env.calls)
    dumped = env.model_dump()
    assert type(dumped["run_id"]) is str
    assert dumped["session_id"] == "user-42"
    restored = _Envelope.model_validate_json(env.model_dump_json())
    assert restored == env
    assert type(restored.run_id) is RunId
    assert _Envelope.model_json_schema()["properties"]["run_id"]["type"] == "string"


@given(value=foreign_ids)
def test_pydantic_json_round_trip_of_foreign_ids(value: str) -> None:
    env = _Envelope(run_id=RunId(value), session_id=SessionId(value))
    assert _Envelope.model_validate_json(env.model_dump_json()) == env


def test_pydantic_reports_crossed_and_malformed_ids() -> None:
    with pytest.raises(ValidationError, match=r"is a SessionId .* not a RunId"):
        _Envelope.model_validate({"run_id": str(SessionId.new())})
    with pytest.raises(ValidationError, match="RunId must not be empty"):
        _Envelope.model_validate({"run_id": ""})
    with pytest.raises(ValidationError, match="string"):
        _Envelope.model_validate({"run_id": 7})


_MYPY_SNIPPET = """
from plexus.core._ids import RunId, SessionId, ToolCallId

def start(session: SessionId, run: RunId) -> None: ...

session = SessionId.new()
run = RunId.new()
start(session, run)                      # fine
start(run, session)                      # line 9: both swapped
start("raw-string", run)                 # line 10: a bare str is not a SessionId
call: ToolCallId = RunId.new()           # line 11: assignment across kinds
text: str = RunId.new()                  # fine: every id is a str
"""


def test_mypy_strict_refuses_crossed_ids(tmp_path: Path) -> None:
    src = tmp_path / "crossed.py"
    src.write_text(textwrap.dedent(_MYPY_SNIPPET))
    stdout, stderr, status = mypy_api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir=/dev/null",
            "--config-file=",
            "--python-version=3.11",
            "--show-error-codes",
            str(src),
        ],
    )
    assert status == 1, stdout + stderr
    errors = [line.removeprefix(f"{src}:") for line in stdout.splitlines() if ": error:" in line]
    assert errors == [
        '9: error: Argument 1 to "start" has incompatible type "RunId"; expected "SessionId"  [arg-type]',
        '9: error: Argument 2 to "start" has incompatible type "SessionId"; expected "RunId"  [arg-type]',
        '10: error: Argument 1 to "start" has incompatible type "str"; expected "SessionId"  [arg-type]',
        '11: error: Incompatible types in assignment (expression has type "RunId", variable has type '
        '"ToolCallId")  [assignment]',
    ]
