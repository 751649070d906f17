"""ArtifactStore (DataRef handles over the object store) and payload-size guards, on a real nats-server."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.object_store import ObjectStore

from plexus.core import content_blocks_from_json, content_blocks_to_json
from plexus.core._content import (
    AudioBlock,
    BaseBlock,
    DocumentBlock,
    ImageBlock,
    MediaBlock,
    TextBlock,
    ToolResultBlock,
    VideoBlock,
)
from plexus.core._errors import KernelError
from plexus.runtime.ops._server import NatsServer
from plexus.runtime.store._artifacts import (
    DEFAULT_INLINE_LIMIT,
    ArtifactNotFoundError,
    ArtifactStore,
    PayloadTooLargeError,
    artifact_id_for,
    check_payload_size,
    headers_size,
    is_artifact_id,
    max_payload_of,
    safe_publish,
)
from plexus.runtime.store._topology import ensure_topology

PNG = b"\x89PNG\r\n\x1a\n"
LIMIT = 1024


def big(n: int = 4 * LIMIT, seed: bytes = b"") -> bytes:
    return PNG + seed + bytes(range(256)) * (n // 256)


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_server.url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def obj(nc: NATS) -> ObjectStore:
    return (await ensure_topology(nc.jetstream())).artifacts


@pytest.fixture
def store(obj: ObjectStore) -> ArtifactStore:
    return ArtifactStore(obj, inline_limit=LIMIT)


async def test_small_blocks_stay_inline_and_identical(store: ArtifactStore) -> None:
    blocks: list[BaseBlock] = [
        TextBlock(text="hi"),
        ImageBlock(data=PNG + b"x" * 10),
        ImageBlock(url="http://a/b"),
    ]
    out = await store.offload(blocks)
    assert all(new is old for new, old in zip(out, blocks, strict=True))


async def test_data_exactly_at_the_limit_stays_inline(store: ArtifactStore) -> None:
    block = ImageBlock(data=PNG + b"x" * (LIMIT - len(PNG)))
    assert (await store.offload([block]))[0] is block


@pytest.mark.parametrize("cls", [ImageBlock, AudioBlock, VideoBlock, DocumentBlock])
async def test_large_media_is_offloaded_and_resolved(
    store: ArtifactStore, cls: type[ImageBlock | AudioBlock | VideoBlock | DocumentBlock]
) -> None:
    data = big()
    block = cls(data=data, mime_type="application/x-test", metadata={"k": "v"})
    [handle] = await store.offload([block])
    assert isinstance(handle, cls)
    assert handle.data is None
    assert handle.file_id == "art_" + hashlib.sha256(data).hexdigest()
    assert handle.mime_type == "application/x-test"
    assert handle.metadata == {"k": "v"}
    assert await store.get(handle.file_id) == data
    assert await store.resolve([handle]) == [block]


async def test_offloaded_blocks_travel_small_and_survive_json(store: ArtifactStore) -> None:
    block = ImageBlock(data=big(200_000), alt="a chart")
    [handle] = await store.offload([block])
    wire = content_blocks_to_json([handle])
    assert len(wire) < 500
    [decoded] = content_blocks_from_json(wire)
    assert decoded == handle
    assert isinstance(decoded, ImageBlock)
    assert decoded.mime_type == "image/png"  # sniffed from the original data, kept on the handle
    assert await store.resolve([decoded]) == [block]


async def test_nested_tool_results_are_offloaded_recursively(store: ArtifactStore) -> None:
    pdf = b"%PDF-" + big()
    inner = ToolResultBlock(call_id="c2", content=[DocumentBlock(data=pdf, filename="r.pdf")])
    outer = ToolResultBlock(call_id="c1", content=[TextBlock(text="see"), inner, ImageBlock(data=b"tiny")])
    untouched = ToolResultBlock(call_id="c3", content=[TextBlock(text="nothing big")])
    out = await store.offload([outer, untouched])
    assert out[1] is untouched
    new_outer = out[0]
    assert isinstance(new_outer, ToolResultBlock)
    assert new_outer.content[0] is outer.content[0]
    assert new_outer.content[2] is outer.content[2]
    new_inner = new_outer.content[1]
    assert isinstance(new_inner, ToolResultBlock)
    doc = new_inner.content[0]
    assert isinstance(doc, DocumentBlock)
    assert (doc.data, doc.file_id, doc.filename, doc.mime_type) == (
        None,
        artifact_id_for(pdf),
        "r.pdf",
        "application/pdf",
    )
    assert await store.resolve(out) == [outer, untouched]


async def test_equal_data_is_stored_once(store: ArtifactStore, obj: ObjectStore) -> None:
    data = big()
    out = await store.offload([ImageBlock(data=data), AudioBlock(data=data)])
    again = await store.offload([VideoBlock(data=data)])
    ids = {b.file_id for b in [*out, *again] if isinstance(b, MediaBlock)}
    assert ids == {artifact_id_for(data)}
    assert [info.name for info in await obj.list()] == [artifact_id_for(data)]


async def test_concurrent_puts_of_the_same_data_agree(store: ArtifactStore) -> None:
    data = big(50_000)
    ids = await asyncio.gather(*(store.put(data) for _ in range(5)))
    assert set(ids) == {artifact_id_for(data)}
    assert await store.get(ids[0]) == data


async def test_a_foreign_file_id_survives_the_round_trip(store: ArtifactStore) -> None:
    block = ImageBlock(data=big(), file_id="file-provider-123")
    [handle] = await store.offload([block])
    assert isinstance(handle, ImageBlock)
    assert is_artifact_id(handle.file_id)
    assert await store.resolve([handle]) == [block]


async def test_resolve_leaves_other_blocks_alone(store: ArtifactStore) -> None:
    blocks: list[BaseBlock] = [
        ImageBlock(file_id="file-provider-123"),
        ImageBlock(url="https://x/y.png"),
        TextBlock(text="art_" + "0" * 64),
        ImageBlock(data=b"inline", file_id=artifact_id_for(b"other")),  # already has its bytes
    ]
    out = await store.resolve(blocks)
    assert all(new is old for new, old in zip(out, blocks, strict=True))


async def test_unknown_artifacts_are_a_typed_error(store: ArtifactStore) -> None:
    missing = artifact_id_for(b"never stored")
    with pytest.raises(ArtifactNotFoundError) as info:
        await store.get(missing)
    assert info.value.file_id == missing
    with pytest.raises(ArtifactNotFoundError):
        await store.get("file-provider-123")
    with pytest.raises(ArtifactNotFoundError):
        await store.resolve([ImageBlock(file_id=missing)])
    assert not await store.exists(missing)
    assert not await store.exists("nope")
    file_id = await store.put(b"here")
    assert await store.exists(file_id)


async def test_large_artifacts_on_a_small_max_payload_server(tmp_path: Path) -> None:
    server = NatsServer(store_dir=tmp_path / "small", max_payload=4096).start()
    try:
        conn = await nats.connect(server.url)
        try:
            store = ArtifactStore((await ensure_topology(conn.jetstream())).artifacts, inline_limit=1000)
            data = big(50_000)  # many chunks: the chunk size follows the server's max_payload
            [handle] = await store.offload([ImageBlock(data=data)])
            assert isinstance(handle, ImageBlock)
            assert handle.file_id is not None
            assert await store.get(handle.file_id) == data
            assert conn.is_connected
        finally:
            await conn.close()
    finally:
        server.stop()


async def test_safe_publish_refuses_oversized_messages_and_keeps_the_connection(tmp_path: Path) -> None:
    server = NatsServer(store_dir=tmp_path / "small", max_payload=4096).start()
    try:
        conn = await nats.connect(server.url)
        try:
            js = conn.jetstream()
            await js.add_stream(name="T", subjects=["t.>"])
            assert max_payload_of(conn) == max_payload_of(js) == 4096
            sub = await conn.subscribe("c.>")

            with pytest.raises(PayloadTooLargeError) as info:
                await safe_publish(conn, "c.x", b"x" * 5000)
            assert (info.value.size, info.value.limit) == (5000, 4096)
            # The payload alone fits; with headers it would make the server close the connection.
            headers = {"Nats-Msg-Id": "m1", "Foo": "bar"}
            with pytest.raises(PayloadTooLargeError):
                await safe_publish(conn, "c.x", b"x" * 4090, headers=headers)
            with pytest.raises(PayloadTooLargeError):
                await safe_publish(js, "t.x", b"x" * 4090, headers=headers)

            # Exactly at the limit (payload + headers) is accepted by the server: the size is computed right.
            exact = b"y" * (4096 - headers_size(headers))
            await safe_publish(conn, "c.exact", exact, headers=headers)
            msg = await sub.next_msg(timeout=5)
            assert msg.data == exact
            ack = await safe_publish(js, "t.ok", b"small", headers={"Nats-Msg-Id": "m2"})
            assert ack.seq == 1
            await conn.flush(timeout=5)
            assert conn.is_connected
        finally:
            await conn.close()
    finally:
        server.stop()


def test_check_payload_size_boundaries() -> None:
    check_payload_size(4096, 4096)
    with pytest.raises(PayloadTooLargeError, match="4097 bytes exceeds the server's max_payload of 4096"):
        check_payload_size(4097, 4096)


def test_headers_size() -> None:
    assert headers_size(None) == 0
    assert headers_size({}) == 0
    # "NATS/1.0\r\n" + "A: b\r\n" + "\r\n"
    assert headers_size({"A": "b"}) == 10 + 6 + 2


def test_artifact_ids() -> None:
    assert artifact_id_for(b"") == "art_e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert is_artifact_id(artifact_id_for(b"x"))
    assert not is_artifact_id(None)
    assert not is_artifact_id("art_123")
    assert not is_artifact_id("art_" + "G" * 64)


def test_bad_store_arguments(nc: NATS) -> None:
    fake: ObjectStore = ObjectStore("b", "OBJ_b", nc.jetstream())
    with pytest.raises(ValueError, match="inline_limit"):
        ArtifactStore(fake, inline_limit=-1)
    with pytest.raises(ValueError, match="get_timeout"):
        ArtifactStore(fake, get_timeout=0)
    assert ArtifactStore(fake).inline_limit == DEFAULT_INLINE_LIMIT == 64 * 1024


def test_errors_round_trip_the_wire() -> None:
    for err in (PayloadTooLargeError(10, 5), ArtifactNotFoundError("art_x")):
        assert isinstance(err, KernelError)
        assert KernelError.from_wire(err.to_wire()) == err
