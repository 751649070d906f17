"""Fuzz inputs: valid messages for every subject a client can reach, then seeded mutations of them.

Every input is built from the real encoders (`encode_envelope`, the orchestration Structs), so a mutation
starts from what Plexus itself would send and the fuzzer explores the edges of the accepted language.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from plexus.core import MessageId, RunId, TextBlock
from plexus.runtime.wire._envelope import Envelope, RunInfo, encode_envelope, payload_from_blocks
from plexus.runtime.wire._orchestration import (
    CancelNotice,
    CancelRequest,
    CrashReport,
    FinishedReport,
    GetRunRequest,
    PauseNotice,
    SpawnRequest,
    StartRunRequest,
)
from plexus.runtime.wire._subjects import Subjects

#: Keys the fuzzer aims at (the liveness rounds use keys of their own, so they never meet fuzzed state).
KEYS = [f"f{i}" for i in range(8)]
#: The one fuzzed agent whose EventLog the fuzzer never writes junk into itself: hostile reply addresses aim
#: at it, and the harness checks at the end that its log still reads (issue 9 item 7).
VICTIM = "f1"
#: Odd keys: long (escaped subjects near and past the server's limits), dots, wildcards, spaces, non-ASCII.
ODD_KEYS = ["k" * 200, "k" * 1000, "k" * 4000, "a.b", "*", ">", "sp ace", "ключ", ""]
TYPES = ["echo", "echo-eph", "spawner", "listener", "ghost"]
#: Reply addresses a worker must refuse: too long for a control line, wildcards, spaces, empty, and
#: Plexus's own state subjects (another agent's EventLog or inbox, a budget counter).
HOSTILE_REPLIES = [
    "_INBOX." + "y" * 5000,
    "_INBOX.*",
    "_INBOX.>",
    "_INBOX.a b",
    "",
    f"px.default.evlog.echo.{VICTIM}",
    "px.default.in.echo.f2",
    "px.default.ctr.run_x.tokens",
]


@dataclass
class Shot:
    """One message to send: the subject, body, headers, whether it goes through JetStream, and the kind of
    target (for the report)."""

    kind: str
    subject: str
    data: bytes
    headers: dict[str, str] | None = None
    jetstream: bool = False
    reply: bool = False
    notes: list[str] = field(default_factory=list)
    pause_after: float = 0.0  # seconds to wait after sending (reproducers that need an order)

    def describe(self, full: bool = False) -> str:
        """One line for a failure report; `full` keeps the whole body (up to 4 KB) so it can be replayed."""
        head = self.data[:4096] if full else self.data[:120]
        headers = repr(self.headers)[: 6000 if full else 160]
        subject = self.subject if full else self.subject[:80]
        return f"{self.kind} {subject!r} {len(self.data)}B {head!r} headers={headers} {self.notes}"


def _envelope(rng: random.Random, target: str, inbox: str) -> Envelope:
    run_id = str(RunId.new())
    return Envelope(
        id=str(MessageId.new()),
        kind=rng.choice(["send", "send", "publish", "spawn"]),
        target=target,
        sender=rng.choice([None, "echo/f1", "spawner/f2"]),
        reply_to=rng.choice([None, inbox, inbox, rng.choice(HOSTILE_REPLIES)]),
        payload=payload_from_blocks([TextBlock(text=rng.choice(["hi", "x" * rng.randint(0, 300)]))]),
        run=rng.choice(
            [
                None,
                RunInfo(run_id=run_id, root_id=run_id),
                RunInfo(run_id=run_id, root_id=run_id, orchestrated=True),
            ]
        ),
        sent_at=time.time(),
    )


def _orch_body(rng: random.Random, verb: str) -> bytes:
    run_id = str(RunId.new())
    payload = payload_from_blocks([TextBlock(text="go")])
    agent = f"{rng.choice(TYPES)}/{rng.choice(KEYS + ODD_KEYS[:3])}"
    makers: dict[str, Callable[[], Any]] = {
        "start": lambda: StartRunRequest(agent_id=agent, payload=payload, run_id=rng.choice([None, run_id])),
        "spawn": lambda: SpawnRequest(
            parent_run_id=run_id, root_id=run_id, parent_agent=agent, child_agent=agent
        ),
        "finished": lambda: FinishedReport(
            run_id=run_id, status=rng.choice(["completed", "failed", "cancelled"])
        ),
        "crashed": lambda: CrashReport(
            run_id=run_id, agent_id=agent, message_id="m", attempt=2, decision="retry"
        ),
        "cancel": lambda: CancelRequest(run_id=run_id),
        "get": lambda: GetRunRequest(run_id=run_id),
    }
    body = makers[verb]()
    return msgspec.json.encode(body)


# -- mutations of bytes and JSON -------------------------------------------------------------------------


def _flip(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return b"\xff"
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf)


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def _nest(rng: random.Random, data: bytes) -> bytes:
    depth = rng.choice([100, 1000, 3000, 5000])
    nested = b"[" * depth + b"]" * depth
    if rng.random() < 0.5 and b'"payload":' in data:  # still valid JSON: the payload nests, "_p" keeps it
        return data.replace(b'"payload":', b'"payload":[' + nested + b'],"_p":', 1)
    return b'{"v":1,"x":' + nested + b"}"


def _bad_utf8(rng: random.Random, data: bytes) -> bytes:
    at = data.find(b'":"')
    if at < 0:
        return data + b"\xc3\x28"
    return data[: at + 3] + rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80"]) + data[at + 3 :]


def _json_field(rng: random.Random, data: bytes) -> bytes:
    """Replace one top-level field's value with a hostile one (wrong type, huge number, long string, …)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return data
    if not isinstance(obj, dict) or not obj:
        return data
    key = rng.choice(sorted(obj))
    obj[key] = rng.choice(
        [
            None,
            True,
            -1,
            2**70,
            1e308,
            "",
            "x" * rng.choice([100, 5000, 70000]),
            "_INBOX." + "y" * 5000,
            f"px.default.evlog.echo.{VICTIM}",
            "a b*>",
            [],
            {},
            [1, "two", None],
            {"type": "nope"},
            {"error_type": "", "fields": {"dimension": 5}},
            {"run_id": "run_x", "orchestrated": True},
        ]
    )
    return json.dumps(obj).encode(errors="surrogatepass") if isinstance(obj, dict) else data


def _odd_blocks(rng: random.Random, data: bytes) -> bytes:
    """Replace the payload with blocks the receiver may not know or that do not validate."""
    blocks = rng.choice(
        [
            [{"type": "hologram", "x": 1}],
            [{"type": "text"}],
            [{"type": "text", "text": 5}],
            [{"type": 7}],
            [{}],
            [[]],
            {"type": "text", "text": "not a list"},
            [{"type": "image", "url": "file:///etc/passwd", "mime_type": "x" * 5000}],
        ]
    )
    try:
        obj = json.loads(data)
    except ValueError:
        return data
    if not isinstance(obj, dict):
        return data
    obj["payload"] = blocks
    return json.dumps(obj).encode()


def _huge_int(rng: random.Random, data: bytes) -> bytes:
    return data.replace(b'"v":1', b'"v":' + b"9" * rng.choice([20, 500, 5000]), 1)


MUTATIONS: list[Callable[[random.Random, bytes], bytes]] = [
    _flip,
    _truncate,
    _nest,
    _bad_utf8,
    _json_field,
    _json_field,
    _huge_int,
    _odd_blocks,
]


def _headers(rng: random.Random, env_id: str) -> dict[str, str] | None:
    base = {"Nats-Msg-Id": env_id, "Plexus-V": "1"}
    choice = rng.randrange(10)
    if choice == 0:
        return None
    if choice == 1:
        return {**base, "Status": rng.choice(["404", "408", "409", "100", "503"]), "Description": "x"}
    if choice == 2:
        return {**base, "Plexus-V": rng.choice(["2", "1" * 5000, "one", "", "1.9"])}
    if choice == 3:
        return {"Plexus-V": "1"}  # no message id
    if choice == 4:
        return {**base, "Nats-Msg-Id": "other-" + env_id}
    return base


# -- shots -----------------------------------------------------------------------------------------------


def _subject(build: Callable[[str, str], str], base: str, verb: str, agent_type: str, key: str) -> str:
    """The subject Plexus would use; for a key it refuses (too long, empty), the raw unescaped subject a
    hostile client would use instead."""
    try:
        return build(agent_type, key)
    except Exception:
        return f"{base}.{verb}.{agent_type}.{key}"


def shot(rng: random.Random, subjects: Subjects, inbox: str) -> Shot:
    """One fuzzed message for a randomly chosen reachable subject."""
    kind = rng.choice(["inbox"] * 4 + ["eph"] * 2 + ["orch"] * 2 + ["ctl", "topic", "evlog", "ctr"])
    agent_type = rng.choice(TYPES)
    key = rng.choice(KEYS) if rng.random() < 0.95 else rng.choice(ODD_KEYS)
    if kind in ("inbox", "eph"):
        env = _envelope(rng, f"{agent_type}/{key}" if rng.random() < 0.9 else f"{rng.choice(TYPES)}/x", inbox)
        data = encode_envelope(env)
        notes: list[str] = []
        if rng.random() < 0.8:
            mutation = rng.choice(MUTATIONS)
            notes.append(mutation.__name__)
            data = mutation(rng, data)
        headers = _headers(rng, env.id)
        if kind == "inbox":
            subject = _subject(subjects.inbox, subjects.base, "in", agent_type, key)
            return Shot(kind, subject, data, headers, jetstream=True, notes=notes)
        subject = _subject(subjects.ephemeral, subjects.base, "eph", agent_type, key)
        return Shot(kind, subject, data, headers, reply=True, notes=notes)
    if kind == "orch":
        verb = rng.choice(["start", "spawn", "finished", "crashed", "cancel", "get"])
        data = _orch_body(rng, verb)
        if rng.random() < 0.7:
            data = rng.choice(MUTATIONS)(rng, data)
        return Shot("orch", f"{subjects.base}.orch.{verb}", data, reply=True, notes=[verb])
    if kind == "ctl":
        root = str(RunId.new())
        notice: Any = rng.choice(
            [
                CancelNotice(root_id=root, run_id=root, reason="fuzz"),
                CancelNotice(root_id=root, run_id=root, reason="fuzz", error={"error_type": ""}),
                PauseNotice(root_id=root, run_id=root, paused=rng.random() < 0.5),
            ]
        )
        verb = "pause" if isinstance(notice, PauseNotice) else "cancel"
        data = rng.choice(MUTATIONS)(rng, msgspec.json.encode(notice))
        return Shot("ctl", subjects.control(verb, root), data)
    if kind == "topic":
        env = _envelope(rng, f"listener/{key}", inbox)
        data = rng.choice(MUTATIONS)(rng, encode_envelope(env))
        subject = _subject(subjects.topic, subjects.base, "topic", "fuzz", key)
        return Shot("topic", subject, data, _headers(rng, env.id))
    if kind == "evlog":
        return Shot(
            "evlog",
            _subject(subjects.evlog, subjects.base, "evlog", agent_type, key if key != VICTIM else "f0"),
            rng.choice(MUTATIONS)(rng, b'[{"type":"reply"}]'),
            jetstream=True,
        )
    counter = f"{subjects.base}.ctr.{RunId.new()}.{rng.choice(['tokens', 'turns', 'cost_micros'])}"
    headers = rng.choice([None, {"Nats-Incr": rng.choice(["1", "-5", "x", "9" * 40])}])
    return Shot("ctr", counter, b"", headers, jetstream=True)
