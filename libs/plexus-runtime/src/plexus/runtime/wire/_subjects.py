"""NATS subject, stream, bucket, KV-key and consumer names (pure functions, no I/O).

Types, keys, sources and namespaces are data, so each is escaped into ONE subject token from the alphabet
``[A-Za-z0-9_-]``: characters in ``[A-Za-z0-9-]`` stay, every other character becomes ``_XX`` per UTF-8 byte
(uppercase hex), and the empty string becomes ``_``. The escaping is canonical (one token per string), so a
key maps to exactly one subject and therefore to exactly one partition.

Every builder checks the finished subject against `MAX_SUBJECT_BYTES` and raises `SubjectTooLongError`
instead of handing NATS a subject that would close the connection or be dropped.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field

__all__ = [
    "BUCKET_ARTIFACTS",
    "BUCKET_CHECKPOINTS",
    "BUCKET_CONSUMERS",
    "BUCKET_LEASES",
    "BUCKET_REGISTRY",
    "BUCKET_SUBSCRIPTIONS",
    "BUCKET_WORKERS",
    "DEFAULT_PREFIX",
    "MAX_CONSUMER_NAME",
    "MAX_SUBJECT_BYTES",
    "STREAM_DLQ",
    "STREAM_EVENTS",
    "STREAM_INBOX",
    "STREAM_PROGRESS",
    "SubjectTooLongError",
    "Subjects",
    "checkpoint_key",
    "consumer_name",
    "consumer_record_key",
    "escape_token",
    "inbox_partition",
    "inbox_transform",
    "lease_key",
    "reply_subject_problem",
    "unescape_token",
]

DEFAULT_PREFIX = "px"

# nats-server closes the connection on a protocol line over 4096 bytes, and the subject is only part of the
# line: `HPUB <subject> <reply inbox> <hdr len> <total len>`, and JetStream API requests wrap subjects again
# (`$JS.API.CONSUMER.CREATE.<stream>.<consumer ≤255>.<filter>`, `$JS.API.DIRECT.GET.<stream>.<subject>`).
# 3584 leaves 512 bytes for those wrappers while a 1 KiB key of any bytes (≤ 3072 escaped) still fits.
MAX_SUBJECT_BYTES = 3584
MAX_CONSUMER_NAME = 255
# The inbox transform lengthens `…in.<type>.<key>` to `…inp.<type>.<p>.<key>`; `inbox()` keeps room for that
# (up to 10^7 partitions) so the stored subject is within the limit too.
_TRANSFORM_GROWTH = len("inp.") - len("in.") + len("9999999.")

STREAM_INBOX = "PLEXUS_INBOX"
STREAM_EVENTS = "PLEXUS_EVENTS"
STREAM_PROGRESS = "PLEXUS_PROGRESS"
STREAM_DLQ = "PLEXUS_DLQ"

BUCKET_CHECKPOINTS = "plexus_checkpoints"
BUCKET_REGISTRY = "plexus_registry"
BUCKET_WORKERS = "plexus_workers"
BUCKET_SUBSCRIPTIONS = "plexus_subscriptions"
BUCKET_LEASES = "plexus_leases"
BUCKET_CONSUMERS = "plexus_consumers"  # each inbox partition's current consumer name (secret per type)
BUCKET_ARTIFACTS = "plexus_artifacts"  # an object store, not a KV bucket


class SubjectTooLongError(ValueError):
    """A subject (or a KV key inside its API subject) is longer than `MAX_SUBJECT_BYTES`."""

    def __init__(self, subject: str, limit: int = MAX_SUBJECT_BYTES) -> None:
        self.subject = subject
        self.length = len(subject.encode("utf-8"))
        self.limit = limit
        super().__init__(
            f"subject is {self.length} bytes long; the limit is {limit} bytes (starts {subject[:80]!r})"
        )

    def __reduce__(self) -> tuple[type[SubjectTooLongError], tuple[str, int]]:
        return type(self), (self.subject, self.limit)


# --------------------------------------------------------------------------------------------------------
# Token escaping

_SAFE_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-"
_SAFE_RE = re.compile(r"[A-Za-z0-9-]+")
_TOKEN_RE = re.compile(r"(?:[A-Za-z0-9-]|_[0-9A-F]{2})+")
_ESCAPE_RE = re.compile(r"_([0-9A-F]{2})")
# Indexed by byte value (the string is passed through latin-1, one char per UTF-8 byte): str.translate does
# the per-character work in C.
_BYTE_TABLE = [chr(b) if chr(b) in _SAFE_CHARS else f"_{b:02X}" for b in range(256)]
_PREFIX_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")


def escape_token(s: str) -> str:
    """Escape any string into one subject token of ``[A-Za-z0-9_-]`` (reversible with `unescape_token`).

    Raises TypeError for a non-string and ValueError for a string with lone surrogates (not valid UTF-8).
    """
    if not isinstance(s, str):
        raise TypeError(f"a subject token must be escaped from a str, not {type(s).__name__}")
    if _SAFE_RE.fullmatch(s):
        return s
    if not s:
        return "_"
    try:
        utf8 = s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{s!r} cannot be escaped: {exc.reason} at index {exc.start}") from None
    return utf8.decode("latin-1").translate(_BYTE_TABLE)


def unescape_token(tok: str) -> str:
    """Invert `escape_token`; raises ValueError naming the problem for a token it could not have produced."""
    if not isinstance(tok, str):
        raise TypeError(f"a subject token must be a str, not {type(tok).__name__}")
    if _SAFE_RE.fullmatch(tok):
        return tok
    if tok == "_":
        return ""
    if not _TOKEN_RE.fullmatch(tok):
        raise ValueError(f"malformed subject token {tok!r}: {_token_problem(tok)}")
    latin = _ESCAPE_RE.sub(lambda m: chr(int(m[1], 16)), tok)
    try:
        text = latin.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"malformed subject token {tok!r}: escaped bytes are not valid UTF-8 ({exc.reason})"
        ) from None
    canonical = escape_token(text)
    if canonical != tok:
        # e.g. `_41` for "A": accepting it would give one key two subjects and so two partitions.
        raise ValueError(f"malformed subject token {tok!r}: not in canonical form (expected {canonical!r})")
    return text


def _token_problem(tok: str) -> str:
    if not tok:
        return "empty (the empty string is escaped as '_')"
    i = 0
    while i < len(tok):
        c = tok[i]
        if c == "_":
            hex2 = tok[i + 1 : i + 3]
            if len(hex2) < 2 or any(h not in "0123456789ABCDEF" for h in hex2):
                return f"'_' at index {i} must be followed by two uppercase hex digits, got {hex2!r}"
            i += 3
            continue
        if c not in _SAFE_CHARS:
            return f"character {c!r} at index {i} is outside [A-Za-z0-9_-]"
        i += 1
    return "unknown problem"  # pragma: no cover - only called when _TOKEN_RE rejected the token


def _check(subject: str, limit: int = MAX_SUBJECT_BYTES) -> str:
    # Escaped tokens and validated prefixes are ASCII, so characters are bytes here.
    if len(subject) > limit:
        raise SubjectTooLongError(subject, limit)
    return subject


#: Reply addresses live under the NATS inbox namespace (nats-py's and every official client's default), never
#: under a Plexus prefix: a reply aimed at `px.<ns>.evlog.…` would write into another agent's EventLog.
REPLY_PREFIX = "_INBOX."
#: A reply subject carries the escaped message id (up to 256 characters, so up to ~3,100 bytes); one near
#: the 4096-byte protocol line would make nats-server close the replying worker's connection ("maximum
#: control line exceeded"), so the limit is the one every Plexus subject keeps.
MAX_REPLY_BYTES = MAX_SUBJECT_BYTES
_REPLY_RE = re.compile(r"_INBOX(?:\.[A-Za-z0-9_-]+)+")


def reply_subject_problem(subject: object) -> str | None:
    """Why `subject` may not receive a reply (None when it may): too long, outside the inbox namespace
    (``_INBOX.<token>…``), or with a token outside ``[A-Za-z0-9_-]`` (wildcards, spaces, empty tokens)."""
    if not isinstance(subject, str):
        return f"a reply address must be a string, got {type(subject).__name__}"
    if len(subject.encode()) > MAX_REPLY_BYTES:
        return f"reply address of {len(subject.encode())} bytes exceeds {MAX_REPLY_BYTES}"
    if not subject.startswith(REPLY_PREFIX):
        return f"reply address {subject[:64]!r} is not under {REPLY_PREFIX!r}"
    if _REPLY_RE.fullmatch(subject) is None:
        return f"reply address {subject[:64]!r} has an empty token or a character outside [A-Za-z0-9_-]"
    return None


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not prefix:
        raise ValueError("the subject prefix must be a non-empty string")
    for token in prefix.split("."):
        if not _PREFIX_TOKEN_RE.fullmatch(token):
            raise ValueError(
                f"subject prefix {prefix!r}: every dot-separated token must be non-empty "
                f"[A-Za-z0-9_-], got {token!r}"
            )
    return prefix


def _check_partition(partition: int) -> int:
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"a partition must be an int >= 0, got {partition!r}")
    return partition


def _check_partitions(partitions: int) -> int:
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"the partition count must be an int >= 1, got {partitions!r}")
    return partitions


# --------------------------------------------------------------------------------------------------------
# Subjects of one namespace


@dataclass(frozen=True, slots=True)
class Subjects:
    """Subject builders for one namespace: ``Subjects("ns").inbox("echo", "k")`` → ``px.ns.in.echo.k``.

    Builders escape every data argument, check the length and return the subject string; parsers invert
    them and raise ValueError for a subject of another shape, prefix or namespace.
    """

    namespace: str = "default"
    prefix: str = DEFAULT_PREFIX
    base: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_prefix(self.prefix)
        object.__setattr__(self, "base", f"{self.prefix}.{escape_token(self.namespace)}")

    def _two(self, kind: str, first: str, second: str, limit: int = MAX_SUBJECT_BYTES) -> str:
        return _check(f"{self.base}.{kind}.{escape_token(first)}.{escape_token(second)}", limit)

    # -- inboxes ----------------------------------------------------------------------------------------
    def inbox(self, agent_type: str, key: str) -> str:
        """``<prefix>.<ns>.in.<type>.<key>``: the durable inbox (JetStream `PLEXUS_INBOX`).

        Its limit is `MAX_SUBJECT_BYTES` less the growth of the stream's partition transform.
        """
        return self._two("in", agent_type, key, MAX_SUBJECT_BYTES - _TRANSFORM_GROWTH)

    def inbox_partitioned(self, agent_type: str, partition: int, key: str) -> str:
        """``<prefix>.<ns>.inp.<type>.<p>.<key>``: the stored subject after the stream's transform."""
        _check_partition(partition)
        return _check(f"{self.base}.inp.{escape_token(agent_type)}.{partition}.{escape_token(key)}")

    def inbox_partitioned_filter(self, agent_type: str, partition: int) -> str:
        """``<prefix>.<ns>.inp.<type>.<p>.>``: the filter of partition ``p``'s consumer."""
        _check_partition(partition)
        return _check(f"{self.base}.inp.{escape_token(agent_type)}.{partition}.>")

    def ephemeral(self, agent_type: str, key: str) -> str:
        """``<prefix>.<ns>.eph.<type>.<key>``: core-NATS inbox of a stateless agent type."""
        return self._two("eph", agent_type, key)

    def ephemeral_queue(self, agent_type: str) -> str:
        """The queue group shared by all workers serving a stateless type: ``<prefix>.<ns>.eph.<type>``."""
        return _check(f"{self.base}.eph.{escape_token(agent_type)}")

    def ephemeral_wildcard(self, agent_type: str) -> str:
        """``<prefix>.<ns>.eph.<type>.*``: what those workers subscribe to."""
        return _check(f"{self.base}.eph.{escape_token(agent_type)}.*")

    # -- other subjects -------------------------------------------------------------------------------
    def topic(self, topic_type: str, source: str) -> str:
        """``<prefix>.<ns>.topic.<type>.<source>``."""
        return self._two("topic", topic_type, source)

    def topic_wildcard(self) -> str:
        """``<prefix>.<ns>.topic.>``: every topic publication of the namespace."""
        return _check(f"{self.base}.topic.>")

    def topic_queue(self, group: str) -> str:
        """The queue group in which the workers of topic delivery group `group` (workers hosting the same
        stateless types) share publications: one of them receives each publication, once."""
        return _check(f"{self.base}.topicq.{escape_token(group)}")

    def progress(self, root_run: str, agent_type: str, key: str) -> str:
        """``<prefix>.<ns>.progress.<root_run>.<type>.<key>``."""
        return _check(
            f"{self.base}.progress.{escape_token(root_run)}.{escape_token(agent_type)}.{escape_token(key)}"
        )

    def progress_tree(self, root_run: str) -> str:
        """``<prefix>.<ns>.progress.<root_run>.>``: every agent of one run tree."""
        return _check(f"{self.base}.progress.{escape_token(root_run)}.>")

    def stream(self, agent_type: str, key: str) -> str:
        """``<prefix>.<ns>.stream.<type>.<key>``: token deltas (core NATS only)."""
        return self._two("stream", agent_type, key)

    def evlog(self, agent_type: str, key: str) -> str:
        """``<prefix>.<ns>.evlog.<type>.<key>``: the agent's EventLog (JetStream `PLEXUS_EVENTS`)."""
        return self._two("evlog", agent_type, key)

    def control(self, verb: str, *tokens: str) -> str:
        """``<prefix>.<ns>.ctl.<verb>[.<token>…]``: control broadcasts (cancellation, drain)."""
        parts = [self.base, "ctl", escape_token(verb), *(escape_token(t) for t in tokens)]
        return _check(".".join(parts))

    def dlq(self, agent_type: str) -> str:
        """``<prefix>.<ns>.dlq.<type>``: dead letters of one agent type."""
        return _check(f"{self.base}.dlq.{escape_token(agent_type)}")

    # -- parsers ----------------------------------------------------------------------------------------
    def _tokens(self, subject: str, kind: str, count: int) -> list[str]:
        head = f"{self.base}.{kind}."
        if not isinstance(subject, str) or not subject.startswith(head):
            raise ValueError(f"subject {subject!r} does not start with {head!r}")
        tokens = subject[len(head) :].split(".")
        if len(tokens) != count:
            raise ValueError(
                f"subject {subject!r} must have {count} tokens after {head!r}, has {len(tokens)}"
            )
        return tokens

    def parse_inbox(self, subject: str) -> tuple[str, str]:
        """``(agent_type, key)`` of an `inbox` subject."""
        type_tok, key_tok = self._tokens(subject, "in", 2)
        return unescape_token(type_tok), unescape_token(key_tok)

    def parse_ephemeral(self, subject: str) -> tuple[str, str]:
        """``(agent_type, key)`` of an `ephemeral` subject."""
        type_tok, key_tok = self._tokens(subject, "eph", 2)
        return unescape_token(type_tok), unescape_token(key_tok)

    def parse_partitioned(self, subject: str) -> tuple[str, str, int]:
        """``(agent_type, key, partition)`` of a stored (transformed) inbox subject."""
        type_tok, part_tok, key_tok = self._tokens(subject, "inp", 3)
        # str.isdigit accepts non-ASCII digits; the server only ever writes ASCII decimals without sign.
        if not (part_tok.isascii() and part_tok.isdigit()) or (len(part_tok) > 1 and part_tok[0] == "0"):
            raise ValueError(f"subject {subject!r}: partition token {part_tok!r} is not a decimal number")
        return unescape_token(type_tok), unescape_token(key_tok), int(part_tok)


# --------------------------------------------------------------------------------------------------------
# Stream configuration


def inbox_transform(partitions: int, prefix: str = DEFAULT_PREFIX) -> tuple[str, str]:
    """``(source, destination)`` of `PLEXUS_INBOX`'s subject transform: add ``partition(P, key)`` as a token.

    Wildcard indexes count ``*`` tokens only, so they stay 1 (namespace), 2 (type), 3 (key) whatever the
    number of prefix tokens.
    """
    _check_partitions(partitions)
    _check_prefix(prefix)
    source = f"{prefix}.*.in.*.*"
    partition = f"{{{{partition({partitions},3)}}}}"
    destination = ".".join(
        (prefix, "{{wildcard(1)}}", "inp", "{{wildcard(2)}}", partition, "{{wildcard(3)}}")
    )
    return source, destination


def inbox_partition(key: str, partitions: int) -> int:
    """The partition the server's transform assigns to ``key``: FNV-1a 32 of the escaped key token mod P.

    Mirrors nats-server's ``partition()`` (tested against a real server) so clients and tools can tell
    which partition, hence which lease owner, serves a key without publishing.
    """
    _check_partitions(partitions)
    h = 0x811C9DC5
    for byte in escape_token(key).encode("ascii"):
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


# --------------------------------------------------------------------------------------------------------
# KV keys and consumer names


def _kv_key(bucket: str, key: str) -> str:
    # The longest subject a KV key travels in is nats-py's direct get:
    # `$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`.
    if len(key) + len(f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.") > MAX_SUBJECT_BYTES:
        raise SubjectTooLongError(f"$KV.{bucket}.{key}")
    return key


@functools.lru_cache(maxsize=8192)  # every message's target is checked (intake) and read (activation)
def checkpoint_key(namespace: str, agent_type: str, key: str) -> str:
    """Key of one agent's checkpoint in `plexus_checkpoints`: ``<ns>.<type>.<key>`` (escaped tokens)."""
    return _kv_key(
        BUCKET_CHECKPOINTS, f"{escape_token(namespace)}.{escape_token(agent_type)}.{escape_token(key)}"
    )


_NONCE_RE = re.compile(r"[0-9a-f]+")


def consumer_record_key(namespace: str, agent_type: str, partition: int) -> str:
    """Key of the record naming a partition's current consumer in `plexus_consumers`: ``<ns>.<type>.<p>``."""
    _check_partition(partition)
    return _kv_key(BUCKET_CONSUMERS, f"{escape_token(namespace)}.{escape_token(agent_type)}.{partition}")


def lease_key(namespace: str, agent_type: str, partition: int) -> str:
    """Key of one partition's lease in `plexus_leases`: ``<ns>.<type>.<p>``."""
    _check_partition(partition)
    return _kv_key(BUCKET_LEASES, f"{escape_token(namespace)}.{escape_token(agent_type)}.{partition}")


def consumer_name(
    namespace: str, agent_type: str, partition: int, prefix: str = DEFAULT_PREFIX, *, nonce: str | None = None
) -> str:
    """Durable consumer name of one inbox partition: ``<prefix>__<ns>__<type>__<p>`` (escaped tokens), with
    ``__<nonce>`` appended for one ownership of the partition. The workers draw a random 128-bit nonce per
    take (lower-case hex), so that a displaced owner's pull requests and acks can never reach its
    successor's consumer, and so that nobody who was not told the name (a worker of another pool) can pull
    from, ack on or delete it: the name is kept in ``plexus_consumers`` (`consumer_record_key`).

    ``__`` separates because no non-empty escaped token contains it or ends with ``_`` — a single ``_``
    would let ``("a", "2E.")`` and ``("a.", "2E")`` share a name. Names over 255 characters keep a readable
    head and end in ``__h`` + the SHA-256 of the full name; a nonce is hex, which has no ``h``, so the two
    forms never collide.
    """
    _check_partition(partition)
    _check_prefix(prefix)
    name = f"{escape_token(prefix)}__{escape_token(namespace)}__{escape_token(agent_type)}__{partition}"
    if nonce is not None:
        if not isinstance(nonce, str) or not _NONCE_RE.fullmatch(nonce):
            raise ValueError(f"nonce must be lower-case hex, got {nonce!r}")
        name = f"{name}__{nonce}"
    if len(name) <= MAX_CONSUMER_NAME:
        return name
    digest = hashlib.sha256(name.encode("ascii")).hexdigest()
    return f"{name[: MAX_CONSUMER_NAME - len(digest) - 3]}__h{digest}"
