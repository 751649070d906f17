"""Hypothesis strategies for content blocks, shared by all core tests via ``tests.core.strategies``."""

from __future__ import annotations

from hypothesis import strategies as st

from plexus.core._content import (
    AudioBlock,
    BaseBlock,
    CodeBlock,
    DataBlock,
    DocumentBlock,
    ErrorBlock,
    ImageBlock,
    MediaBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UIResourceBlock,
    UnknownBlock,
    VideoBlock,
)
from plexus.core._json import JsonValue

__all__ = [
    "UNKNOWN_TYPE_PREFIX",
    "block_strategies",
    "content_blocks",
    "json_objects",
    "json_values",
    "leaf_blocks",
    "media_blocks",
    "metadata_maps",
    "texts",
    "unknown_blocks",
]

# Unknown block types are generated under this prefix so they never collide with a registered type.
UNKNOWN_TYPE_PREFIX = "x-unknown-"

# Lone surrogates cannot be encoded as UTF-8 JSON, so no real peer can send them.
texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=20)
_short_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.", min_size=1, max_size=10)

json_values: st.SearchStrategy[JsonValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=10,
)
json_objects: st.SearchStrategy[dict[str, JsonValue]] = st.dictionaries(texts, json_values, max_size=4)
# Keys are drawn in random order, which is what the sorted-key serialization must neutralise.
metadata_maps: st.SearchStrategy[dict[str, JsonValue]] = st.dictionaries(
    _short_names, json_values, max_size=4
)

_MAGIC = (b"", b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"%PDF-", b"ID3", b"OggS", b"fLaC")
_payloads = st.builds(lambda magic, tail: magic + tail, st.sampled_from(_MAGIC), st.binary(max_size=24))


@st.composite
def media_blocks(draw: st.DrawFn, cls: type[MediaBlock] | None = None) -> MediaBlock:
    """A media block of ``cls`` (any built-in media class when None) with at least one source."""
    media_classes: list[type[MediaBlock]] = [ImageBlock, AudioBlock, VideoBlock, DocumentBlock]
    block_cls = cls or draw(st.sampled_from(media_classes))
    sources = draw(st.sets(st.sampled_from(["url", "data", "file_id"]), min_size=1))
    fields: dict[str, object] = {"metadata": draw(metadata_maps)}
    if "url" in sources:
        fields["url"] = "https://example.com/" + draw(_short_names)
    if "data" in sources:
        fields["data"] = draw(_payloads)
    if "file_id" in sources:
        fields["file_id"] = "file_" + draw(_short_names)
    fields["mime_type"] = draw(st.none() | st.sampled_from(["image/png", "audio/wav", "application/pdf"]))
    extras: dict[type[MediaBlock], str] = {
        ImageBlock: "alt",
        AudioBlock: "transcript",
        DocumentBlock: "filename",
    }
    extra = extras.get(block_cls)
    if extra is not None:
        fields[extra] = draw(st.none() | texts)
    return block_cls.model_validate(fields)


@st.composite
def unknown_blocks(draw: st.DrawFn) -> UnknownBlock:
    """An unregistered block type with arbitrary fields, ``type`` at a random position."""
    keys = _short_names.filter(lambda k: k != "type")
    items = list(draw(st.dictionaries(keys, json_values, max_size=4)).items())
    if draw(st.booleans()):
        items.append(("metadata", draw(metadata_maps)))
    items.insert(draw(st.integers(0, len(items))), ("type", UNKNOWN_TYPE_PREFIX + draw(_short_names)))
    return UnknownBlock.from_dict(dict(items))


def block_strategies() -> dict[type[BaseBlock], st.SearchStrategy[BaseBlock]]:
    """One strategy per built-in block class (ToolResultBlock nests any of them), plus UnknownBlock."""
    md = metadata_maps
    opt = st.none() | texts
    leaves: dict[type[BaseBlock], st.SearchStrategy[BaseBlock]] = {
        TextBlock: st.builds(TextBlock, text=texts, metadata=md),
        CodeBlock: st.builds(CodeBlock, code=texts, language=opt, metadata=md),
        DataBlock: st.builds(
            DataBlock, data=json_objects, schema_id=opt, json_schema=st.none() | json_objects, metadata=md
        ),
        ErrorBlock: st.builds(
            ErrorBlock,
            error_type=texts,
            message=texts,
            recoverable=st.booleans(),
            details=json_objects,
            metadata=md,
        ),
        ImageBlock: media_blocks(ImageBlock),
        AudioBlock: media_blocks(AudioBlock),
        VideoBlock: media_blocks(VideoBlock),
        DocumentBlock: media_blocks(DocumentBlock),
        ToolUseBlock: st.builds(
            ToolUseBlock, call_id=texts, tool_name=texts, arguments=json_objects, kind=opt, metadata=md
        ),
        ThinkingBlock: st.builds(
            ThinkingBlock, content=texts, redacted=st.booleans(), signature=opt, metadata=md
        ),
        UIResourceBlock: st.builds(UIResourceBlock, uri=texts, render_mode=texts, metadata=md),
        UnknownBlock: unknown_blocks(),
    }
    leaves[ToolResultBlock] = _tool_results(st.one_of(list(leaves.values())), nested=True)
    return leaves


def _tool_results(
    children: st.SearchStrategy[BaseBlock], nested: bool = False
) -> st.SearchStrategy[BaseBlock]:
    content = st.lists(children, max_size=3)
    if nested:  # one level of ToolResultBlock-in-ToolResultBlock so the per-type strategy covers nesting
        content = st.lists(children | _tool_results(children), max_size=3)
    return st.builds(
        ToolResultBlock,
        call_id=texts,
        content=content,
        is_error=st.booleans(),
        terminate=st.booleans(),
        metadata=metadata_maps,
    )


def leaf_blocks(include_unknown: bool = True) -> st.SearchStrategy[BaseBlock]:
    """Every built-in block type except ToolResultBlock (plus UnknownBlock unless disabled)."""
    return st.one_of(
        [
            strategy
            for cls, strategy in block_strategies().items()
            if cls is not ToolResultBlock and (include_unknown or cls is not UnknownBlock)
        ]
    )


def content_blocks(include_unknown: bool = True, max_leaves: int = 8) -> st.SearchStrategy[BaseBlock]:
    """Any block, including ToolResultBlocks nesting further blocks (and each other)."""
    return st.recursive(leaf_blocks(include_unknown), _tool_results, max_leaves=max_leaves)
