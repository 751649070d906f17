"""End to end against a real nats-server: any key reaches its agent unchanged, keys that escape alike never
share an activation, and a key too long for NATS fails with `SubjectTooLongError` before anything is sent."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from nats.aio.msg import Msg

from plexus.core import AgentId, ImageBlock, MessageId, ProtocolError, TextBlock
from plexus.runtime.store._artifacts import artifact_id_for
from plexus.runtime.wire._subjects import SubjectTooLongError, checkpoint_key, escape_token

from .apps_misc import DEADLINE, Served, acked, envelope, reply_error, send_raw, serving

shared = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    async with serving(tmp_path_factory.mktemp("nats")) as served:
        yield served


ODD_KEYS = [
    ("dot", "a.b"),
    ("only-dots", "..."),
    ("star", "*"),
    ("gt", ">"),
    ("wildcards", "a.*.>"),
    ("space", "a b"),
    ("only-spaces", "   "),
    ("underscore", "under_score"),
    ("only-underscore", "_"),
    ("escape-lookalike", "_2E"),
    ("hyphen", "-"),
    ("emoji", "🦄🔥"),
    ("zwj-emoji", "👩\u200d👩\u200d👧"),
    ("cjk", "日本語のキー"),
    ("rtl-hebrew", "שלום"),
    ("rtl-arabic", "مرحبا بالعالم"),
    ("bidi-override", "\u202eabc\u202c"),
    ("combining-mark", "e\u0301"),
    ("nul-and-controls", "\x00\x01\x1f\x7f"),
    ("crlf-tab", "a\r\nb\tc"),
    ("slashes", "a/b/c"),
    ("only-slash", "/"),
    ("backslash", "a\\b"),
    ("quotes", "\"'`"),
    ("percent", "%41%2E"),
    ("js-api-lookalike", "$JS.API.STREAM.DELETE.PLEXUS_INBOX"),
    ("ascii-1k", "x" * 1024),
    ("cjk-1k-bytes", "漢" * 341),
    ("mixed-1k-bytes", ("a.🦄 日/" * 100)[:300]),
]


@shared
@pytest.mark.parametrize("key", [k for _, k in ODD_KEYS], ids=[i for i, _ in ODD_KEYS])
@pytest.mark.parametrize("agent_type", ["keys", "keys-eph"])
async def test_odd_key_reaches_its_agent_unchanged(served: Served, key: str, agent_type: str) -> None:
    reply = await served.rt.send_message([TextBlock(text="hi")], AgentId(agent_type, key), timeout=DEADLINE)
    assert reply == [TextBlock(text=key)]
    assert isinstance(reply[0], TextBlock)
    assert reply[0].text.encode("utf-8") == key.encode("utf-8")


def test_the_big_keys_are_as_big_as_promised() -> None:
    keys = dict(ODD_KEYS)
    assert len(keys["ascii-1k"].encode()) == 1024
    assert 1020 <= len(keys["cjk-1k-bytes"].encode()) <= 1024


@shared
async def test_keys_that_escape_alike_keep_separate_activations(served: Served) -> None:
    """ "a.b" escapes to "a_2Eb"; the literal key "a_2Eb" must not share its subject, partition or state."""
    rt = served.rt
    for first, second in [("a.b", "a_2Eb"), (" ", "_20"), ("_", "_5F")]:
        assert escape_token(first) != escape_token(second)
        got = [
            await rt.send_message([TextBlock(text="+")], AgentId("counter", k), timeout=DEADLINE)
            for k in (first, first, second, first, second)
        ]
        assert got == [
            [TextBlock(text=f"{first}#1")],
            [TextBlock(text=f"{first}#2")],
            [TextBlock(text=f"{second}#1")],
            [TextBlock(text=f"{first}#3")],
            [TextBlock(text=f"{second}#2")],
        ]
    with pytest.raises(ValueError, match="empty"):
        AgentId("counter", "")


def _longest_durable_key(served: Served, agent_type: str) -> int:
    """The longest ASCII key whose inbox subject and checkpoint key both fit (found with the builders)."""
    n = 3000
    while True:
        key = "x" * (n + 1)
        try:
            served.rt.subjects.inbox(agent_type, key)
            checkpoint_key(served.rt.namespace, agent_type, key)
        except SubjectTooLongError:
            return n
        n += 1


@shared
async def test_longest_accepted_durable_key_works_end_to_end(served: Served) -> None:
    n = _longest_durable_key(served, "counter")
    for key in ("x" * n, "y" * n):
        reply = await served.rt.send_message([TextBlock(text="+")], AgentId("counter", key), timeout=DEADLINE)
        assert reply == [TextBlock(text=f"{key}#1")]


@contextlib.asynccontextmanager
async def nothing_published(served: Served) -> AsyncIterator[None]:
    """Assert the block publishes nothing under ``px.>`` and stores nothing in the inbox stream.

    A sentinel published afterwards on the same connection arrives after anything the block published
    (NATS keeps one connection's order), so seeing it first proves absence without waiting on a timer.
    """
    rt = served.rt
    spy = await rt.nc.subscribe(f"{rt.prefix}.>")
    before = (await rt.js.stream_info(rt.topology.names.inbox_stream)).state.last_seq
    try:
        yield
        sentinel = f"{rt.prefix}.sentinel.{MessageId.new()}"
        await rt.nc.publish(sentinel, b"")
        seen: list[str] = []
        while not seen or seen[-1] != sentinel:
            msg: Msg = await spy.next_msg(timeout=DEADLINE)
            seen.append(msg.subject)
        assert seen == [sentinel]
        assert (await rt.js.stream_info(rt.topology.names.inbox_stream)).state.last_seq == before
    finally:
        await spy.unsubscribe()


def _image(size: int) -> tuple[ImageBlock, bytes]:
    data = b"\x89PNG\r\n\x1a\n" + bytes(i % 251 for i in range(size))
    return ImageBlock(data=data), data


TOO_LONG = [
    ("ascii-4k", "x" * 4000),
    ("cjk-1200-bytes", "漢" * 400),
    ("emoji-1k", "🦄" * 300),
]


@shared
@pytest.mark.parametrize("key", [k for _, k in TOO_LONG], ids=[i for i, _ in TOO_LONG])
@pytest.mark.parametrize("agent_type", ["keys", "keys-eph"])
async def test_key_too_long_for_a_subject_fails_before_anything_is_published(
    served: Served, key: str, agent_type: str
) -> None:
    # A large image would be offloaded to the object store first if the subject were checked too late.
    image, data = _image(100 * 1024)
    async with nothing_published(served):
        with pytest.raises(SubjectTooLongError) as info:
            await served.rt.send_message([image], AgentId(agent_type, key), timeout=DEADLINE)
    assert info.value.length > info.value.limit
    assert not await served.rt.artifacts.exists(artifact_id_for(data))
    # The connection is fine: SubjectTooLongError is raised before NATS could close it.
    assert served.rt.nc.is_connected
    assert await served.rt.send_message(
        [TextBlock(text="hi")], AgentId(agent_type, "ok"), timeout=DEADLINE
    ) == [TextBlock(text="ok")]


@shared
async def test_key_one_past_the_durable_limit_fails_on_the_client(served: Served) -> None:
    n = _longest_durable_key(served, "counter")
    async with nothing_published(served):
        with pytest.raises(SubjectTooLongError):
            await served.rt.send_message(
                [TextBlock(text="+")], AgentId("counter", "x" * (n + 1)), timeout=DEADLINE
            )


@shared
async def test_worker_dead_letters_a_key_it_could_not_checkpoint(served: Served) -> None:
    """A foreign sender may publish a key whose inbox subject fits but whose checkpoint key does not; the
    worker must reject it (typed error, acked) rather than fail its commit and see it redelivered forever."""
    rt = served.rt
    n = _longest_durable_key(served, "counter") + 1
    key = "x" * n
    rt.subjects.inbox("counter", key)  # still fits
    with pytest.raises(SubjectTooLongError):
        checkpoint_key(rt.namespace, "counter", key)
    env = envelope(str(AgentId("counter", key)), reply_to=rt.nc.new_inbox(), blocks=[TextBlock(text="+")])
    msg, seq = await send_raw(rt, env, durable=True, host="counter", key=key)
    error = reply_error(msg)
    assert type(error) is ProtocolError
    assert "(target)" in str(error)
    assert seq is not None
    await acked(rt, seq)  # not left for redelivery
