"""Subject escaping, builders, parsers, KV keys and consumer names; the inbox transform on a real server."""

from __future__ import annotations

import asyncio
import pickle
import re
from collections.abc import Callable

import nats
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from nats.js.api import ConsumerConfig, StreamConfig, SubjectTransform

from plexus.runtime.ops._server import NatsServer
from plexus.runtime.wire._subjects import (
    BUCKET_CHECKPOINTS,
    MAX_CONSUMER_NAME,
    MAX_SUBJECT_BYTES,
    STREAM_INBOX,
    Subjects,
    SubjectTooLongError,
    checkpoint_key,
    consumer_name,
    escape_token,
    inbox_partition,
    inbox_transform,
    lease_key,
    unescape_token,
)

TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")
KV_KEY_RE = re.compile(r"[-/_=.A-Za-z0-9]+")  # nats-py's own KV key rule
texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]))
ROOT = "run_01JD3W6Q2V6C7X4N8B9M0P1R2S"
ROOT_TOK = "run_5F01JD3W6Q2V6C7X4N8B9M0P1R2S"  # minted ids hold '_', the escape character
WORST_KB_KEY = "é" * 512  # 1024 UTF-8 bytes, every one escaped: the longest 1 KiB key

# Keys that break naive subjects: separators, wildcards, whitespace, the escape char itself, unicode, 1 KiB.
ODD_KEYS = [
    "a.b",
    "*",
    ">",
    "a b",
    " ",
    "_",
    "_2E",
    "tab\there",
    "nul\x00",
    "ünïcödé/ключ/鍵/🔑",
    "x" * 1024,
    WORST_KB_KEY,
]

# --------------------------------------------------------------------------------------------------------
# escape_token / unescape_token


@pytest.mark.parametrize(
    ("raw", "token"),
    [
        ("abc-XYZ-09", "abc-XYZ-09"),
        ("", "_"),
        ("_", "_5F"),
        ("a.b", "a_2Eb"),
        ("*", "_2A"),
        (">", "_3E"),
        (" ", "_20"),
        ("\x00", "_00"),
        ("é", "_C3_A9"),
        ("🔑", "_F0_9F_94_91"),
    ],
)
def test_escape_examples(raw: str, token: str) -> None:
    assert escape_token(raw) == token
    assert unescape_token(token) == raw


@given(texts)
def test_escape_round_trips_and_stays_in_the_alphabet(s: str) -> None:
    token = escape_token(s)
    assert TOKEN_RE.fullmatch(token)
    assert unescape_token(token) == s


@given(texts, texts)
def test_escape_is_injective(a: str, b: str) -> None:
    assume(a != b)
    assert escape_token(a) != escape_token(b)


@given(st.text(alphabet="AB09-_CEF3", max_size=12))
def test_every_accepted_token_is_canonical(token: str) -> None:
    # Whatever unescape accepts, escape gives back exactly: one string ↔ one token ↔ one partition.
    try:
        text = unescape_token(token)
    except ValueError:
        return
    assert escape_token(text) == token


def test_escape_rejects_lone_surrogates_and_non_strings() -> None:
    with pytest.raises(ValueError, match=r"cannot be escaped.*surrogate"):
        escape_token("a\ud800")
    with pytest.raises(TypeError, match="not bytes"):
        escape_token(b"abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not int"):
        unescape_token(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("", "empty"),
        ("a.b", r"character '\.' at index 1 is outside"),
        ("a b", "character ' ' at index 1"),
        ("é", "character 'é' at index 0"),
        ("_4", r"'_' at index 0 must be followed by two uppercase hex digits, got '4'"),
        ("ab_", r"'_' at index 2 must be followed by two uppercase hex digits, got ''"),
        ("_zz", "got 'zz'"),
        ("_2e", "got '2e'"),  # lowercase hex is not what escape writes
        ("__", "got '_'"),
        ("_FF", "not valid UTF-8"),
        ("_C3", "not valid UTF-8"),  # truncated multi-byte sequence
        ("_41", r"not in canonical form \(expected 'A'\)"),
        ("a_2D", r"expected 'a-'"),
    ],
)
def test_unescape_rejects_malformed_tokens(token: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        unescape_token(token)


# --------------------------------------------------------------------------------------------------------
# Subjects builders and parsers


def test_builders_produce_the_documented_subjects() -> None:
    s = Subjects("default")
    assert s.inbox("echo", "k1") == "px.default.in.echo.k1"
    assert s.inbox_partitioned("echo", 3, "k1") == "px.default.inp.echo.3.k1"
    assert s.inbox_partitioned_filter("echo", 3) == "px.default.inp.echo.3.>"
    assert s.ephemeral("echo", "k1") == "px.default.eph.echo.k1"
    assert s.ephemeral_queue("echo") == "px.default.eph.echo"
    assert s.ephemeral_wildcard("echo") == "px.default.eph.echo.*"
    assert s.topic("news", "src") == "px.default.topic.news.src"
    assert s.progress(ROOT, "echo", "k1") == f"px.default.progress.{ROOT_TOK}.echo.k1"
    assert s.progress_tree(ROOT) == f"px.default.progress.{ROOT_TOK}.>"
    assert s.stream("echo", "k1") == "px.default.stream.echo.k1"
    assert s.evlog("echo", "k1") == "px.default.evlog.echo.k1"
    assert s.control("cancel", ROOT) == f"px.default.ctl.cancel.{ROOT_TOK}"
    assert s.control("drain") == "px.default.ctl.drain"
    assert s.dlq("echo") == "px.default.dlq.echo"


def test_builders_escape_every_data_argument() -> None:
    s = Subjects("my.ns", prefix="acme.px")
    assert s.base == "acme.px.my_2Ens"
    assert s.inbox("a.b", "c d") == "acme.px.my_2Ens.in.a_2Eb.c_20d"
    assert s.progress("r.1", "t", "*") == "acme.px.my_2Ens.progress.r_2E1.t._2A"
    assert s.control("v.x", "a>", "") == "acme.px.my_2Ens.ctl.v_2Ex.a_3E._"
    assert s.topic("t", ">") == "acme.px.my_2Ens.topic.t._3E"


@pytest.mark.parametrize("prefix", ["", "a..b", ".px", "px.", "a b", "p*", "p>", "é"])
def test_prefix_must_be_plain_tokens(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        Subjects("default", prefix=prefix)
    with pytest.raises(ValueError, match="prefix"):
        inbox_transform(4, prefix)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_partition_arguments_are_validated(bad: object) -> None:
    s = Subjects()
    with pytest.raises(ValueError, match="partition must be an int >= 0"):
        s.inbox_partitioned_filter("echo", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partition must be an int >= 0"):
        s.inbox_partitioned("echo", bad, "k")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partition must be an int >= 0"):
        lease_key("default", "echo", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partition must be an int >= 0"):
        consumer_name("default", "echo", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -2, True, 2.0])
def test_partition_count_is_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="partition count must be an int >= 1"):
        inbox_transform(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partition count must be an int >= 1"):
        inbox_partition("k", bad)  # type: ignore[arg-type]


@given(texts, texts, st.integers(0, 10_000))
def test_parsers_invert_builders(agent_type: str, key: str, p: int) -> None:
    s = Subjects("ns-1")
    assert s.parse_inbox(s.inbox(agent_type, key)) == (agent_type, key)
    assert s.parse_ephemeral(s.ephemeral(agent_type, key)) == (agent_type, key)
    assert s.parse_partitioned(s.inbox_partitioned(agent_type, p, key)) == (agent_type, key, p)


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ("px.other.in.echo.k", "does not start with 'px.default.in.'"),
        ("qx.default.in.echo.k", "does not start with"),
        ("px.default.eph.echo.k", "does not start with"),
        ("px.default.in.echo", "must have 2 tokens after 'px.default.in.', has 1"),
        ("px.default.in.echo.k.extra", "has 3"),
        ("px.default.in.echo.a_2eb", "got '2e'"),
        ("px.default.in.echo.", "empty"),
    ],
)
def test_parse_inbox_rejects_foreign_subjects(subject: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Subjects("default").parse_inbox(subject)


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ("px.default.inp.echo.x.k", "partition token 'x' is not a decimal"),
        ("px.default.inp.echo.-1.k", "partition token '-1'"),
        ("px.default.inp.echo.01.k", "partition token '01'"),
        ("px.default.inp.echo.٣.k", "partition token '٣'"),  # a non-ASCII digit
        ("px.default.inp.echo.3", "must have 3 tokens"),
        ("px.default.in.echo.k", "does not start with 'px.default.inp.'"),
    ],
)
def test_parse_partitioned_rejects_malformed_subjects(subject: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Subjects("default").parse_partitioned(subject)


def test_parse_ephemeral_rejects_an_inbox_subject() -> None:
    with pytest.raises(ValueError, match=re.escape("does not start with 'px.default.eph.'")):
        Subjects().parse_ephemeral("px.default.in.echo.k")


# --------------------------------------------------------------------------------------------------------
# Length limit

_LONG = "x" * MAX_SUBJECT_BYTES
_BUILDERS: dict[str, Callable[[Subjects, str], str]] = {
    "inbox": lambda s, a: s.inbox("echo", a),
    "inbox_partitioned": lambda s, a: s.inbox_partitioned("echo", 1, a),
    "inbox_partitioned_filter": lambda s, a: s.inbox_partitioned_filter(a, 1),
    "ephemeral": lambda s, a: s.ephemeral(a, "k"),
    "ephemeral_queue": lambda s, a: s.ephemeral_queue(a),
    "ephemeral_wildcard": lambda s, a: s.ephemeral_wildcard(a),
    "topic": lambda s, a: s.topic("news", a),
    "progress": lambda s, a: s.progress(ROOT, "echo", a),
    "progress_tree": lambda s, a: s.progress_tree(a),
    "stream": lambda s, a: s.stream("echo", a),
    "evlog": lambda s, a: s.evlog("echo", a),
    "control": lambda s, a: s.control("cancel", a),
    "dlq": lambda s, a: s.dlq(a),
    "checkpoint_key": lambda s, a: checkpoint_key(s.namespace, "echo", a),
    "lease_key": lambda s, a: lease_key(s.namespace, a, 1),
}


@pytest.mark.parametrize("builder", sorted(_BUILDERS))
def test_every_builder_refuses_an_overlong_subject(builder: str) -> None:
    with pytest.raises(SubjectTooLongError) as info:
        _BUILDERS[builder](Subjects(), _LONG)
    assert info.value.limit <= MAX_SUBJECT_BYTES
    assert info.value.length > info.value.limit
    assert f"{info.value.length} bytes long; the limit is {info.value.limit}" in str(info.value)


@pytest.mark.parametrize("builder", sorted(_BUILDERS))
def test_a_worst_case_one_kib_key_fits_every_builder(builder: str) -> None:
    subject = _BUILDERS[builder](Subjects(), WORST_KB_KEY)
    assert len(subject) <= MAX_SUBJECT_BYTES
    assert escape_token(WORST_KB_KEY) in subject


def _longest_inbox_key(s: Subjects, agent_type: str) -> str:
    """The longest key `inbox` accepts, found by search so the test does not restate the rule."""
    lo, hi = 0, MAX_SUBJECT_BYTES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            s.inbox(agent_type, "x" * mid)
            lo = mid
        except SubjectTooLongError:
            hi = mid - 1
    return "x" * lo


def test_limits_are_exact_and_leave_room_in_the_protocol_line() -> None:
    s = Subjects()
    head = len(s.evlog("echo", ""))  # ends in the 1-char token "_"
    assert len(s.evlog("echo", "x" * (MAX_SUBJECT_BYTES - head + 1))) == MAX_SUBJECT_BYTES
    with pytest.raises(SubjectTooLongError):
        s.evlog("echo", "x" * (MAX_SUBJECT_BYTES - head + 2))
    # The inbox keeps room for the transform: its longest key still gives a legal stored subject with a
    # seven-digit partition, and one more character would not.
    key = _longest_inbox_key(s, "echo")
    assert len(s.inbox_partitioned("echo", 9_999_999, key)) == MAX_SUBJECT_BYTES
    # HPUB line: subject, a reply inbox, two lengths; plus the JetStream API wrappers around subjects.
    assert MAX_SUBJECT_BYTES + len("$JS.API.CONSUMER.CREATE.PLEXUS_EVENTS.") + MAX_CONSUMER_NAME + 100 < 4096


def test_subject_too_long_error_is_a_value_error_and_pickles() -> None:
    err = SubjectTooLongError("px." + "x" * 5000)
    assert isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.length, again.limit, str(again)) == (err.length, err.limit, str(err))


# --------------------------------------------------------------------------------------------------------
# KV keys, consumer names, stream and bucket names


def test_kv_keys() -> None:
    assert checkpoint_key("default", "echo", "a.b") == "default.echo.a_2Eb"
    assert lease_key("my.ns", "echo", 7) == "my_2Ens.echo.7"
    for key in ODD_KEYS:
        assert KV_KEY_RE.fullmatch(checkpoint_key("default", "echo", key))
    # The ns/type/key split stays unambiguous because each part is one escaped token.
    assert checkpoint_key("a.b", "c", "d") != checkpoint_key("a", "b.c", "d")


def test_consumer_names() -> None:
    assert consumer_name("default", "echo", 3) == "px__default__echo__3"
    assert consumer_name("default", "echo", 3, prefix="acme.px") == "acme_2Epx__default__echo__3"
    # With a single '_' separator these two would share a consumer and steal each other's partition.
    assert consumer_name("a", "2E.", 0) != consumer_name("a.", "2E", 0)


def test_long_consumer_names_are_hashed_stably() -> None:
    long_ns = "n" * 300
    name = consumer_name(long_ns, "echo", 1)
    assert len(name) == MAX_CONSUMER_NAME
    assert TOKEN_RE.fullmatch(name)
    assert name.startswith("px__nnn")
    assert re.search(r"__h[0-9a-f]{64}\Z", name)
    assert consumer_name(long_ns, "echo", 1) == name
    assert consumer_name(long_ns, "echo", 2) != name
    assert consumer_name(long_ns + "m", "echo", 1) != name


@given(texts, texts, st.integers(0, 99), texts, texts, st.integers(0, 99))
def test_consumer_names_are_injective(ns1: str, t1: str, p1: int, ns2: str, t2: str, p2: int) -> None:
    assume(ns1 and t1 and ns2 and t2)  # AgentId forbids empty types and namespaces
    assume((ns1, t1, p1) != (ns2, t2, p2))
    a, b = consumer_name(ns1, t1, p1), consumer_name(ns2, t2, p2)
    assert a != b
    assert len(a) <= MAX_CONSUMER_NAME
    assert TOKEN_RE.fullmatch(a)


def test_inbox_transform_strings() -> None:
    assert inbox_transform(16) == (
        "px.*.in.*.*",
        "px.{{wildcard(1)}}.inp.{{wildcard(2)}}.{{partition(16,3)}}.{{wildcard(3)}}",
    )
    assert inbox_transform(4, "acme.px") == (
        "acme.px.*.in.*.*",
        "acme.px.{{wildcard(1)}}.inp.{{wildcard(2)}}.{{partition(4,3)}}.{{wildcard(3)}}",
    )


# --------------------------------------------------------------------------------------------------------
# Against a real nats-server


async def test_odd_keys_travel_on_exact_subjects(nats_server: NatsServer) -> None:
    s = Subjects("default")
    nc = await nats.connect(nats_server.url)
    try:
        subs = [await nc.subscribe(s.inbox("echo", key)) for key in ODD_KEYS]
        for i, key in enumerate(ODD_KEYS):
            await nc.publish(s.inbox("echo", key), str(i).encode())
        # A second round after the first: anything delivered to the wrong subscriber (a wildcard leak or a
        # dropped subject) shows up ahead of, or instead of, the "end" marker.
        for key in ODD_KEYS:
            await nc.publish(s.inbox("echo", key), b"end")
        for i, (key, sub) in enumerate(zip(ODD_KEYS, subs, strict=True)):
            first = await sub.next_msg(timeout=5)
            assert first.data == str(i).encode()
            assert first.subject == s.inbox("echo", key)
            assert s.parse_inbox(first.subject) == ("echo", key)
            assert (await sub.next_msg(timeout=5)).data == b"end"
    finally:
        await nc.close()


async def _inbox_stream(js: nats.js.JetStreamContext, name: str, partitions: int, prefix: str) -> None:
    source, destination = inbox_transform(partitions, prefix)
    await js.add_stream(
        StreamConfig(
            name=name,
            subjects=[source],
            subject_transform=SubjectTransform(src=source, dest=destination),
        )
    )


async def test_the_stream_transform_partitions_by_key(nats_server: NatsServer) -> None:
    partitions = 8
    s = Subjects("default")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await _inbox_stream(js, STREAM_INBOX, partitions, "px")
        keys = [*ODD_KEYS, *(f"key-{i}" for i in range(16))]
        seen: dict[str, int] = {}
        for key in [*keys, *keys]:  # each key twice: the same key must land on the same partition
            ack = await js.publish(s.inbox("echo", key), b"x")
            stored = await js.get_msg(STREAM_INBOX, ack.seq)
            agent_type, parsed_key, p = s.parse_partitioned(stored.subject or "")
            assert (agent_type, parsed_key) == ("echo", key)
            assert p == inbox_partition(key, partitions)  # our local hash is the server's
            assert seen.setdefault(key, p) == p
        assert len(set(seen.values())) > 1
        assert all(0 <= p < partitions for p in seen.values())

        # A partition consumer sees exactly the keys of its partition.
        p0 = seen["a.b"]
        name = consumer_name("default", "echo", p0)
        await js.add_consumer(
            STREAM_INBOX,
            ConsumerConfig(durable_name=name, filter_subject=s.inbox_partitioned_filter("echo", p0)),
        )
        sub = await js.pull_subscribe_bind(name, stream=STREAM_INBOX)
        expected = sorted(k for k in [*keys, *keys] if seen[k] == p0)
        got: list[str] = []
        while len(got) < len(expected):
            batch = await sub.fetch(len(expected) - len(got), timeout=5)
            got.extend(s.parse_partitioned(m.subject)[1] for m in batch)
        assert sorted(got) == expected
    finally:
        await nc.close()


async def test_the_transform_follows_a_custom_prefix(nats_server: NatsServer) -> None:
    s = Subjects("tenant.a", prefix="acme.px")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await _inbox_stream(js, "ACME_INBOX", 4, "acme.px")
        ack = await js.publish(s.inbox("echo", "k.1"), b"x")
        stored = await js.get_msg("ACME_INBOX", ack.seq)
        assert stored.subject == s.inbox_partitioned("echo", inbox_partition("k.1", 4), "k.1")
        assert s.parse_partitioned(stored.subject) == ("echo", "k.1", inbox_partition("k.1", 4))
    finally:
        await nc.close()


async def test_a_maximal_subject_survives_jetstream_and_long_consumer_names(nats_server: NatsServer) -> None:
    s = Subjects("default")
    key = _longest_inbox_key(s, "echo")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await _inbox_stream(js, STREAM_INBOX, 4, "px")
        await js.publish(s.inbox("echo", key), b"x")
        p = inbox_partition(key, 4)
        # The longest consumer name plus a filter holding the whole key: the API subject of this request
        # is the longest the runtime makes; the server must accept it and deliver the message.
        name = consumer_name("n" * 300, "echo", p)
        assert len(name) == MAX_CONSUMER_NAME
        stored_subject = s.inbox_partitioned("echo", p, key)
        await js.add_consumer(STREAM_INBOX, ConsumerConfig(durable_name=name, filter_subject=stored_subject))
        sub = await js.pull_subscribe_bind(name, stream=STREAM_INBOX)
        [msg] = await sub.fetch(1, timeout=5)
        assert s.parse_partitioned(msg.subject) == ("echo", key, p)
        await msg.ack()
        assert nc.is_connected
    finally:
        await nc.close()


async def test_kv_keys_work_in_real_buckets(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=BUCKET_CHECKPOINTS, history=1, direct=True)
        for i, key in enumerate(ODD_KEYS):
            await kv.put(checkpoint_key("default", "echo", key), str(i).encode())
        for i, key in enumerate(ODD_KEYS):
            entry = await asyncio.wait_for(kv.get(checkpoint_key("default", "echo", key)), 5)
            assert entry.value == str(i).encode()
        leases = await js.create_key_value(bucket="plexus_leases", history=1)
        assert await leases.create(lease_key("my.ns", "a.b", 3), b"w1") > 0
    finally:
        await nc.close()
