"""Content blocks: wire round trips, registry dispatch, unknown-type preservation, media and DataRef."""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from plexus.core import content_blocks_from_json, content_blocks_to_json
from plexus.core._content import (
    AudioBlock,
    BaseBlock,
    CodeBlock,
    ContentBlock,
    DataBlock,
    DataRef,
    DocumentBlock,
    ErrorBlock,
    Handle,
    ImageBlock,
    InlineBytes,
    InlineText,
    MediaBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UIResourceBlock,
    UnknownBlock,
    Uri,
    VideoBlock,
    content_block_from_dict,
    content_block_to_dict,
    model_facing,
    register_block_type,
    registered_block_types,
)
from plexus.core._json import dumps_sorted
from tests.core.strategies import (
    block_strategies,
    content_blocks,
    json_objects,
    metadata_maps,
    unknown_blocks,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
BUILTIN_TYPES = {
    "text": TextBlock,
    "code": CodeBlock,
    "data": DataBlock,
    "error": ErrorBlock,
    "image": ImageBlock,
    "audio": AudioBlock,
    "video": VideoBlock,
    "document": DocumentBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "ui_resource": UIResourceBlock,
}


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- round trips


def test_every_builtin_type_is_registered_under_its_seed_name() -> None:
    registry = registered_block_types()
    for name, cls in BUILTIN_TYPES.items():
        assert registry[name] is cls


def test_strategies_cover_every_builtin_type() -> None:
    assert set(BUILTIN_TYPES.values()) | {UnknownBlock} == set(block_strategies())


@pytest.mark.parametrize("cls", [*BUILTIN_TYPES.values(), UnknownBlock], ids=lambda c: c.__name__)
@given(data=st.data())
def test_json_round_trip_per_type(cls: type[BaseBlock], data: st.DataObject) -> None:
    block = data.draw(block_strategies()[cls])
    assert type(block) is cls
    decoded = content_block_from_dict(json.loads(block.model_dump_json()))
    assert decoded == block
    assert type(decoded) is cls
    assert content_block_from_dict(content_block_to_dict(block)) == block


@given(st.lists(content_blocks(), max_size=4))
def test_list_json_helpers_round_trip(blocks: list[BaseBlock]) -> None:
    encoded = content_blocks_to_json(blocks)
    assert isinstance(encoded, bytes)
    decoded = content_blocks_from_json(encoded)
    assert decoded == blocks
    assert content_blocks_to_json(decoded) == encoded  # stable: re-encoding changes nothing
    assert content_blocks_from_json(encoded.decode()) == blocks  # str input works too


def test_content_blocks_from_json_reports_the_failing_location() -> None:
    bad = b'[{"type":"text","text":"ok"},{"type":"tool_result","call_id":"c","content":[{"type":"image"}]}]'
    with pytest.raises(ValidationError) as info:
        content_blocks_from_json(bad)
    (error,) = info.value.errors()
    assert error["loc"] == (1, "content", 0)
    assert "at least one of url, data or file_id" in error["msg"]


def test_content_blocks_from_json_rejects_non_list_and_bad_json() -> None:
    with pytest.raises(ValidationError):
        content_blocks_from_json(b'{"type":"text","text":"x"}')
    with pytest.raises(ValidationError):
        content_blocks_from_json(b"[{")


# ---------------------------------------------------------------------------------------------- field rules


@given(content_blocks())
def test_blocks_are_immutable(block: BaseBlock) -> None:
    with pytest.raises(ValidationError, match="frozen"):
        block.metadata = {}  # type: ignore[misc]


@pytest.mark.parametrize(
    ("block", "field", "value"),
    [
        (TextBlock(text="a"), "text", "b"),
        (ToolResultBlock(call_id="c", content=[]), "terminate", True),
        (ThinkingBlock(content="x", signature="s"), "signature", "t"),
        (ImageBlock(url="u"), "data", PNG),
    ],
)
def test_assigning_a_field_raises(block: BaseBlock, field: str, value: object) -> None:
    with pytest.raises(ValidationError, match="frozen"):
        setattr(block, field, value)
    assert getattr(block, field) != value


def test_unknown_fields_are_rejected_on_known_types() -> None:
    with pytest.raises(ValidationError, match="extra"):
        content_block_from_dict({"type": "text", "text": "x", "colour": "red"})


def test_type_literal_must_match_the_class() -> None:
    with pytest.raises(ValidationError, match="'text'"):
        TextBlock.model_validate({"type": "code", "text": "x"})


def test_json_fields_reject_non_json_values() -> None:
    with pytest.raises(ValidationError):
        ErrorBlock(error_type="E", message="m", details={"when": object()})
    with pytest.raises(ValidationError):
        TextBlock(text="x", metadata={"raw": b"bytes"})


def test_error_block_defaults_and_details_round_trip() -> None:
    err = ErrorBlock(error_type="BudgetExhaustedError", message="out of tokens")
    assert (err.recoverable, err.details) == (False, {})
    typed = ErrorBlock(error_type="SpawnDenied", message="m", recoverable=True, details={"max_agents": 3})
    assert content_block_from_dict(json.loads(typed.model_dump_json())) == typed


def test_data_block_keeps_schema_id_and_json_schema() -> None:
    block = DataBlock(data={"ok": True}, schema_id="urn:x", json_schema={"type": "object"})
    wire = content_block_to_dict(block)
    assert wire["json_schema"] == {"type": "object"}
    assert wire["schema_id"] == "urn:x"


def test_thinking_signature_survives_json_and_model_facing() -> None:
    signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+/=="
    block = ThinkingBlock(content="because", redacted=True, signature=signature, metadata={"k": 1})
    decoded = content_blocks_from_json(content_blocks_to_json([block]))[0]
    assert isinstance(decoded, ThinkingBlock)
    assert decoded.signature == signature
    assert decoded.redacted is True
    assert model_facing(decoded).signature == signature


def test_tool_use_kind_hint_round_trips() -> None:
    block = ToolUseBlock(call_id="c1", tool_name="fs.read", arguments={"path": "a"}, kind="read")
    assert content_block_from_dict(content_block_to_dict(block)) == block
    assert ToolUseBlock(call_id="c", tool_name="t").kind is None


# ---------------------------------------------------------------------------------------------- ContentBlock


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    blocks: list[ContentBlock]


def test_content_block_as_field_type_dispatches_and_serializes_by_runtime_class() -> None:
    env = _Envelope.model_validate(
        {"blocks": [{"type": "code", "code": "x=1", "language": "py"}, {"type": "nope", "z": 1}]}
    )
    assert isinstance(env.blocks[0], CodeBlock)
    assert isinstance(env.blocks[1], UnknownBlock)
    # Serialized with the subclass's fields, not just the base's `type`/`metadata`.
    dumped = env.model_dump(mode="json")
    assert dumped["blocks"][0] == {"type": "code", "metadata": {}, "code": "x=1", "language": "py"}
    assert dumped["blocks"][1] == {"type": "nope", "z": 1}
    assert _Envelope.model_validate_json(env.model_dump_json()) == env


def test_content_block_field_accepts_instances_and_rejects_other_values() -> None:
    text = TextBlock(text="hi")
    assert _Envelope(blocks=[text]).blocks[0] is text
    with pytest.raises(ValidationError, match="must be a dict or a BaseBlock instance, not int"):
        _Envelope.model_validate({"blocks": [5]})


def test_tool_result_content_validates_nested_dicts() -> None:
    result = ToolResultBlock.model_validate(
        {"type": "tool_result", "call_id": "c", "content": [{"type": "image", "url": "https://x/y.png"}]}
    )
    assert result.content == [ImageBlock(url="https://x/y.png")]


def test_json_schema_generation_works() -> None:
    schema = ToolResultBlock.model_json_schema()
    assert schema["properties"]["content"]["type"] == "array"


# ---------------------------------------------------------------------------------------------- from_dict


def test_from_dict_without_type_is_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match="no 'type' key"):
        content_block_from_dict({"text": "x"})


@pytest.mark.parametrize("bad_type", [None, 3, ["text"], {"a": 1}])
def test_from_dict_with_non_string_type_is_a_clear_value_error(bad_type: object) -> None:
    with pytest.raises(ValueError, match="'type' must be a string"):
        content_block_from_dict({"type": bad_type, "text": "x"})


def test_from_dict_rejects_non_mappings() -> None:
    with pytest.raises(TypeError, match="must be a mapping"):
        content_block_from_dict(["type", "text"])  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------- unknown blocks

UNKNOWN_JSON = (
    '{"z_last":[1,2.5,{"b":null,"a":"ü"}],"type":"hologram","metadata":{"zeta":1,"alpha":{"y":1,"x":2}},'
    '"deep":{"k":[true,false,-7,0.125,12345678901234567890]}}'
)


def test_unknown_block_preserves_every_field_byte_for_byte() -> None:
    raw = json.loads(UNKNOWN_JSON)
    block = content_block_from_dict(raw)
    assert isinstance(block, UnknownBlock)
    assert block.type == "hologram"
    assert block.metadata == {"zeta": 1, "alpha": {"y": 1, "x": 2}}
    assert json.dumps(content_block_to_dict(block)) == json.dumps(raw)
    assert json.dumps(block.model_dump()) == json.dumps(raw)
    # Metadata of unknown blocks is NOT re-sorted: byte-for-byte preservation wins.
    assert block.model_dump_json() == _compact(raw)


def test_unknown_block_float_values_survive_even_where_encoders_format_them_differently() -> None:
    # pydantic writes 1e-05 as 0.00001 (json.dumps keeps 1e-05): the value, and json.dumps bytes, survive.
    raw = {"type": "hologram", "f": 1e-05, "g": -0.0}
    block = content_block_from_dict(raw)
    assert json.dumps(content_block_to_dict(block)) == json.dumps(raw)
    assert json.dumps(json.loads(block.model_dump_json())) == json.dumps(raw)


def test_unknown_block_nested_in_tool_result_is_preserved_byte_for_byte() -> None:
    outer = {
        "type": "tool_result",
        "metadata": {},
        "call_id": "c1",
        "content": [
            json.loads(UNKNOWN_JSON),
            {"type": "text", "metadata": {}, "text": "ok"},
            {"type": "tool_result", "metadata": {}, "call_id": "c2", "content": [{"x": 1, "type": "v9"}]}
            | {"is_error": False, "terminate": False},
        ],
        "is_error": True,
        "terminate": False,
    }
    block = content_block_from_dict(outer)
    assert isinstance(block, ToolResultBlock)
    assert isinstance(block.content[0], UnknownBlock)
    assert json.dumps(content_block_to_dict(block)) == json.dumps(outer)
    wire = _compact([outer]).encode()
    assert content_blocks_to_json(content_blocks_from_json(wire)) == wire


@given(unknown_blocks())
def test_unknown_blocks_reserialize_identically(block: UnknownBlock) -> None:
    raw = json.loads(block.model_dump_json())
    again = content_block_from_dict(raw)
    assert json.dumps(content_block_to_dict(again)) == json.dumps(raw) == json.dumps(block.raw)


def test_unknown_block_constructor_keeps_type_and_metadata_consistent_with_raw() -> None:
    with pytest.raises(ValidationError, match="must equal raw\\['type'\\]"):
        UnknownBlock(type="a", raw={"type": "b"})
    with pytest.raises(ValidationError, match="derived from raw"):
        UnknownBlock(type="a", raw={"type": "a", "metadata": {"k": 1}}, metadata={"k": 2})
    assert UnknownBlock(type="a", raw={"type": "a", "metadata": "not-a-map"}).metadata == {}


# ---------------------------------------------------------------------------------------------- registry


@register_block_type
class StickerBlock(BaseBlock):
    """A custom block used by these tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["test_sticker"] = "test_sticker"
    sticker_id: str


def test_registered_type_dispatches_everywhere() -> None:
    assert registered_block_types()["test_sticker"] is StickerBlock
    assert content_block_from_dict({"type": "test_sticker", "sticker_id": "s1"}) == StickerBlock(
        sticker_id="s1"
    )
    # Nested in a ToolResultBlock and through the cached JSON adapter built before registration.
    wire = b'[{"type":"tool_result","call_id":"c","content":[{"type":"test_sticker","sticker_id":"s2"}]}]'
    (result,) = content_blocks_from_json(wire)
    assert isinstance(result, ToolResultBlock)
    assert result.content == [StickerBlock(sticker_id="s2")]
    assert json.loads(content_blocks_to_json([result]))[0]["content"][0]["sticker_id"] == "s2"


def test_registering_the_same_class_again_is_a_no_op() -> None:
    assert register_block_type(StickerBlock) is StickerBlock
    assert registered_block_types()["test_sticker"] is StickerBlock


def test_model_facing_strips_custom_block_metadata() -> None:
    assert model_facing(StickerBlock(sticker_id="s", metadata={"k": 1})) == StickerBlock(sticker_id="s")


class _NotFrozen(BaseBlock):
    model_config = ConfigDict(frozen=False)
    type: Literal["test_not_frozen"] = "test_not_frozen"


class _StrType(BaseBlock):
    type: str = "test_str_type"


class _TwoLiterals(BaseBlock):
    type: Literal["test_a", "test_b"] = "test_a"


class _IntLiteral(BaseBlock):
    type: Literal[1] = 1  # type: ignore[assignment]


class _EmptyLiteral(BaseBlock):
    type: Literal[""] = ""


class _DuplicateText(BaseBlock):
    type: Literal["text"] = "text"


class _UnknownSub(UnknownBlock):
    pass


class _PlainModel(BaseModel):
    model_config = ConfigDict(frozen=True)
    type: Literal["test_plain"] = "test_plain"


@pytest.mark.parametrize(
    ("cls", "error", "message"),
    [
        (_PlainModel, TypeError, "expects a subclass of BaseBlock"),
        (TextBlock(text="x"), TypeError, "expects a subclass of BaseBlock"),
        (_UnknownSub, TypeError, "fallback for unregistered types"),
        (_NotFrozen, TypeError, "must be frozen"),
        (_StrType, ValueError, "Literal"),
        (_TwoLiterals, ValueError, "exactly one string"),
        (_IntLiteral, ValueError, "exactly one string"),
        (_EmptyLiteral, ValueError, "non-empty"),
        (_DuplicateText, ValueError, "'text' is already registered to TextBlock"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_register_block_type_rejects_malformed_classes(
    cls: Any, error: type[Exception], message: str
) -> None:
    before = registered_block_types()
    with pytest.raises(error, match=message):
        register_block_type(cls)
    assert registered_block_types() == before


# ---------------------------------------------------------------------------------------------- media

MEDIA_CLASSES: list[type[MediaBlock]] = [ImageBlock, AudioBlock, VideoBlock, DocumentBlock]


@pytest.mark.parametrize("cls", MEDIA_CLASSES, ids=lambda c: c.__name__)
def test_media_block_needs_a_source(cls: type[MediaBlock]) -> None:
    with pytest.raises(ValidationError, match=f"{cls.__name__} needs at least one of url, data or file_id"):
        cls.model_validate({})
    for field, value in (("url", "https://x"), ("data", b"\x00"), ("file_id", "f1")):
        assert getattr(cls.model_validate({field: value}), field) == value


@pytest.mark.parametrize(
    ("data", "expected"),
    [(PNG, "image/png"), (b"%PDF-1.4", "application/pdf"), (b"RIFF\0\0\0\0WAVE", "audio/wav"), (b"??", None)],
)
def test_mime_type_is_sniffed_when_missing(data: bytes, expected: str | None) -> None:
    assert DocumentBlock(data=data).mime_type == expected


def test_explicit_mime_type_wins_and_no_data_means_no_sniffing() -> None:
    assert ImageBlock(data=PNG, mime_type="image/x-custom").mime_type == "image/x-custom"
    assert ImageBlock(url="https://x/a.png").mime_type is None


def test_data_is_bytes_in_python_and_base64_on_the_wire() -> None:
    block = AudioBlock(data=b"ID3\x03rest", transcript="hi")
    encoded = base64.b64encode(b"ID3\x03rest").decode()
    assert block.model_dump()["data"] == b"ID3\x03rest"
    assert json.loads(block.model_dump_json())["data"] == encoded
    assert content_block_to_dict(block)["data"] == encoded
    from_wire = content_block_from_dict({"type": "audio", "data": encoded, "transcript": "hi"})
    assert from_wire == block
    assert from_wire.mime_type == "audio/mpeg"  # sniffed after base64 decoding


def test_python_bytes_that_look_like_base64_are_kept_raw() -> None:
    looks_b64 = b"aGVsbG8="
    block = ImageBlock(data=looks_b64)
    assert block.data == looks_b64
    assert content_block_from_dict(json.loads(block.model_dump_json())).data == looks_b64  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", ["not base64!", "aGVsbG8", "aGVs\nbG8="])
def test_invalid_base64_string_is_rejected(bad: str) -> None:
    with pytest.raises(ValidationError, match="base64"):
        content_block_from_dict({"type": "image", "data": bad})


# ---------------------------------------------------------------------------------------------- DataRef

_DATA_REF: TypeAdapter[DataRef] = TypeAdapter(DataRef)


def test_data_ref_prefers_inline_data_then_handle_then_uri() -> None:
    assert ImageBlock(url="u", file_id="f", data=PNG).data_ref == InlineBytes(data=PNG)
    assert ImageBlock(url="u", file_id="f").data_ref == Handle(artifact_id="f")
    assert ImageBlock(url="u").data_ref == Uri(uri="u")


@pytest.mark.parametrize(
    ("ref", "field", "value"),
    [
        (InlineBytes(data=PNG), "data", PNG),
        (InlineText(text=base64.b64encode(PNG).decode()), "data", PNG),
        (Uri(uri="https://x/v.mp4"), "url", "https://x/v.mp4"),
        (Handle(artifact_id="art_1"), "file_id", "art_1"),
    ],
)
@pytest.mark.parametrize("cls", MEDIA_CLASSES, ids=lambda c: c.__name__)
def test_media_block_from_data_ref(cls: type[MediaBlock], ref: DataRef, field: str, value: object) -> None:
    block = cls.from_data_ref(ref, metadata={"k": 1})
    assert type(block) is cls
    assert getattr(block, field) == value
    assert block.metadata == {"k": 1}
    if not isinstance(ref, InlineText):
        assert block.data_ref == ref


def test_from_data_ref_sniffs_and_rejects_bad_inline_text() -> None:
    assert ImageBlock.from_data_ref(InlineBytes(data=PNG)).mime_type == "image/png"
    assert DocumentBlock.from_data_ref(Handle(artifact_id="a"), filename="r.pdf").filename == "r.pdf"
    with pytest.raises(ValidationError, match="base64"):
        ImageBlock.from_data_ref(InlineText(text="not base64!"))


@pytest.mark.parametrize(
    "ref",
    [InlineText(text="aGk="), InlineBytes(data=b"\x00\xff"), Uri(uri="s3://b/k"), Handle(artifact_id="a")],
)
def test_data_ref_union_round_trips(ref: DataRef) -> None:
    assert _DATA_REF.validate_json(_DATA_REF.dump_json(ref)) == ref
    assert _DATA_REF.validate_python(json.loads(_DATA_REF.dump_json(ref))) == ref


def test_data_ref_rejects_unknown_kind_and_is_frozen() -> None:
    with pytest.raises(ValidationError, match="kind"):
        _DATA_REF.validate_python({"kind": "ftp", "uri": "x"})
    with pytest.raises(ValidationError, match="frozen"):
        Handle(artifact_id="a").artifact_id = "b"  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------- metadata


def test_metadata_serializes_with_recursively_sorted_keys() -> None:
    a = TextBlock(text="x", metadata={"b": 1, "a": {"z": [{"d": 1, "c": 2}], "y": 2}})
    b = TextBlock(text="x", metadata={"a": {"y": 2, "z": [{"c": 2, "d": 1}]}, "b": 1})
    assert a.model_dump_json() == b.model_dump_json()
    assert '"metadata":{"a":{"y":2,"z":[{"c":2,"d":1}]},"b":1}' in a.model_dump_json()


@given(content_blocks(include_unknown=False), metadata_maps)
def test_metadata_order_never_changes_the_json(block: BaseBlock, metadata: dict[str, Any]) -> None:
    forward = block.model_copy(update={"metadata": metadata})
    backward = block.model_copy(update={"metadata": dict(reversed(list(metadata.items())))})
    assert forward.model_dump_json() == backward.model_dump_json()
    wire = json.loads(forward.model_dump_json())
    assert list(wire["metadata"]) == sorted(metadata)


@given(json_objects)
def test_dumps_sorted_is_deterministic_compact_json(obj: dict[str, Any]) -> None:
    reordered = dict(reversed(list(obj.items())))
    out = dumps_sorted(obj)
    assert out == dumps_sorted(reordered)
    assert json.loads(out) == obj
    assert ", " not in dumps_sorted({"a": [1, 2], "b": {"c": 1}})


def test_dumps_sorted_rejects_nan() -> None:
    assert dumps_sorted({"b": 1, "a": "é"}) == '{"a":"é","b":1}'
    with pytest.raises(ValueError, match="JSON compliant"):
        dumps_sorted({"x": float("nan")})


# ---------------------------------------------------------------------------------------------- model facing


def test_model_facing_strips_metadata_and_terminate_recursively() -> None:
    inner = ToolResultBlock(call_id="i", content=[TextBlock(text="t", metadata={"k": 1})], terminate=True)
    unknown = content_block_from_dict({"type": "zz", "metadata": {"k": 1}, "v": 2})
    outer = ToolResultBlock(
        call_id="o", content=[inner, unknown], is_error=True, terminate=True, metadata={"hook": "x"}
    )
    facing = model_facing(outer)
    assert facing == ToolResultBlock(
        call_id="o",
        content=[
            ToolResultBlock(call_id="i", content=[TextBlock(text="t")]),
            UnknownBlock(type="zz", raw={"type": "zz", "v": 2}),
        ],
        is_error=True,
    )
    assert outer.terminate is True
    assert outer.metadata == {"hook": "x"}  # the original is untouched


@given(content_blocks())
def test_model_facing_output_has_no_internal_fields(block: BaseBlock) -> None:
    def check(b: BaseBlock) -> None:
        assert b.metadata == {}
        if isinstance(b, UnknownBlock):
            assert "metadata" not in b.raw
        if isinstance(b, ToolResultBlock):
            assert b.terminate is False
            for child in b.content:
                check(child)

    facing = block.for_model()
    check(facing)
    assert type(facing) is type(block)
    assert facing.for_model() == facing
