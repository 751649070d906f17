"""Activations: the in-memory life of one agent instance, restored from and saved to its checkpoint.

The checkpoint document holds the agent's state, the ids (and replies) of recently handled messages — so a
message redelivered after a crash between "handled" and "acked" is answered without running the handler
twice — and the EventLog sequence the activation expects, which fences a zombie writer. Messages committed
after the checkpoint by their EventLog append alone carry their state change (`_delta.py`), which an
activation applies on top of the checkpoint.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, TypeVar

import msgspec

from plexus.core import AgentId
from plexus.runtime._agent import Agent, AgentType
from plexus.runtime.ops._telemetry import INSTRUMENTS, metrics_enabled
from plexus.runtime.store._checkpoints import CheckpointStore
from plexus.runtime.worker._delta import StateParts, apply_delta, encode_parts, join_parts, state_delta

__all__ = ["NO_IDS", "Activation", "ActivationTable", "CheckpointDoc", "LoggedCommit", "LoggedSince"]

A = TypeVar("A")
B = TypeVar("B")

#: How many handled message ids a checkpoint remembers for redelivery de-duplication.
HANDLED_MEMORY = 64
#: How many of the most recent of those keep their encoded reply, to answer a redelivery without the handler.
#: A key runs one message at a time, so a dying worker leaves at most its latest message between commit and
#: reply; the rest cover replies lost with a connection. All 64 replies made a busy key's checkpoint ≈ 23 KB.
REPLY_MEMORY = 16
#: A reply longer than this is not kept (only its id): a large reply would be rewritten with every checkpoint.
REPLY_MAX_BYTES = 4096
#: A message is committed by its EventLog append alone (one write, carrying its state delta); the checkpoint
#: is still written at least every this many messages, which bounds what an activation reads back from the
#: log to rebuild its state and handled-message memory.
CHECKPOINT_EVERY = 16


class CheckpointDoc(msgspec.Struct, omit_defaults=True):
    v: int = 1
    state: dict[str, Any] = {}
    #: (message id, encoded Reply or None) of the most recent handled messages, oldest first.
    handled: list[tuple[str, bytes | None]] = []
    log_seq: int = 0
    progress_seq: int = 0


class _CheckpointOut(msgspec.Struct, omit_defaults=True):
    """`CheckpointDoc` as written, its state already encoded (a commit encodes the state once)."""

    v: int = 1
    state: msgspec.Raw = msgspec.Raw(b"{}")
    handled: list[tuple[str, bytes | None]] = []
    log_seq: int = 0
    progress_seq: int = 0


#: The empty `Activation.logged` every activation shares.
NO_IDS: frozenset[str] = frozenset()

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(CheckpointDoc).decode


@dataclass
class Activation:
    agent_id: AgentId
    agent: Agent
    agent_type: AgentType
    revision: int | None
    log_seq: int
    progress_seq: int
    handled: OrderedDict[str, bytes | None]
    #: The state as of the last commit (checkpoint or delta): its parts, or its whole encoding when a key
    #: is not a string (such a state is checkpointed whenever it changes).
    saved: StateParts | bytes
    last_used: float = field(default_factory=time.monotonic)
    #: Ids of messages whose entries are in the EventLog after the checkpoint's sequence: a worker died
    #: between the two writes. Their redelivery is handled again but not logged a second time. Almost
    #: always empty: the shared `NO_IDS` then, so an idle activation holds no set of its own.
    logged: frozenset[str] = NO_IDS
    #: Messages committed by their EventLog append alone since the checkpoint was last written.
    unsaved: int = 0
    #: The progress sequence as of the last commit (a one-write commit logs it when it moved).
    saved_progress_seq: int = 0
    #: The size of the replies kept among the newest `REPLY_MEMORY` handled ids (-1 until `remember` first
    #: scans them): `remember`'s usual case needs no scan.
    _kept: int = -1
    #: Held only while an append is under way or waited for (`log_turn`): a full collection visits every
    #: object an idle activation holds, and an idle activation needs no lock.
    _log_lock: asyncio.Lock | None = None
    _log_users: int = 0

    def log_turn(self) -> _LogTurn:
        """``async with activation.log_turn():`` serialises this activation's own EventLog appends (a handler
        may spawn children concurrently)."""
        return _LogTurn(self)

    @property
    def saved_state(self) -> bytes:
        """The whole encoded state as of the last commit."""
        return join_parts(self.saved) if isinstance(self.saved, dict) else self.saved

    def encoded_state(self) -> StateParts | bytes:
        """The agent's state now, encoded as `saved` is (compare the two to see a change)."""
        state = self.agent.save_state()
        parts = encode_parts(state)
        return parts if parts is not None else _encode(dict(state))

    def plan_commit(
        self, state: StateParts | bytes, message_id: str, checkpoint_limit: int, deltas: bool = True
    ) -> tuple[bool, bytes | None]:
        """(write the checkpoint?, the state delta to log otherwise) for committing `message_id`.

        The checkpoint is written when the log holds the message already (a dead worker's append), every
        `CHECKPOINT_EVERY` messages, when the state changed in a way no delta says briefly (`DELTA_MAX_BYTES`,
        or a key that is not a string), and when the state would no longer fit in a checkpoint
        (`checkpoint_limit` bytes: that save then fails as it always did, instead of a later one wedging the
        agent). Otherwise none is, not even for a new agent: an activation reads its (at most 15) logged
        commits back. Without `deltas` (an older worker hosts the type too) a state or progress change is
        checkpointed as before."""
        if message_id in self.logged or self.unsaved + 1 >= CHECKPOINT_EVERY:
            return True, None
        if not deltas:
            return state != self.saved or self.progress_seq != self.saved_progress_seq, None
        if state == self.saved:
            return False, None
        if not isinstance(state, dict) or not isinstance(self.saved, dict):
            return True, None
        if self._checkpoint_size(state) > checkpoint_limit:
            return True, None
        delta = state_delta(self.saved, state)
        return delta is None, delta

    def _checkpoint_size(self, state: StateParts) -> int:
        """An upper estimate of the checkpoint's size with `state` (its parts, the handled-message memory)."""
        size = 64 + sum(len(key) * 6 + len(value) + 4 for key, value in state.items())
        return size + sum(
            len(mid) + 8 + (len(reply) * 2 if reply else 4) for mid, reply in self.handled.items()
        )

    def committed(self, state: StateParts | bytes) -> None:
        """The message was committed by its EventLog append alone."""
        self.saved = state
        self.saved_progress_seq = self.progress_seq
        self.unsaved += 1

    def reply_for(self, message_id: str) -> tuple[bool, bytes | None]:
        if message_id in self.handled:
            return True, self.handled[message_id]
        return False, None

    def remember(self, message_id: str, reply: bytes | None, reply_budget: int) -> None:
        """Record a handled message and its encoded reply (None: nobody to answer).

        Replies are kept for the `REPLY_MEMORY` most recent messages, each at most `REPLY_MAX_BYTES`, while
        together they fit in `reply_budget` bytes: the checkpoint is one KV value, and one past the server's
        max_payload would make every later commit of this agent fail. A message whose reply is dropped is
        still known as handled, so a redelivery never runs the handler twice; it only goes unanswered (the
        caller's deadline covers that rare crash between commit and reply).
        """
        handled = self.handled
        known = message_id in handled
        stored = reply if reply is None or len(reply) <= REPLY_MAX_BYTES else None
        handled[message_id] = stored
        handled.move_to_end(message_id)
        while len(handled) > HANDLED_MEMORY:
            handled.popitem(last=False)
        if known or self._kept < 0:
            self._trim_replies(reply_budget)
            return
        # The usual case, without a scan: a new id enters the newest REPLY_MEMORY, the one it pushes out
        # leaves with its reply, and while the replies kept there fit the budget all of them stay — what
        # the scan would decide.
        leaving = next(islice(reversed(handled), REPLY_MEMORY, None), None)
        if leaving is not None:
            left = handled[leaving]
            if left is not None:
                handled[leaving] = None
                self._kept -= len(left)
        if stored is not None:
            self._kept += len(stored)
        if self._kept > reply_budget:  # (a call may bring a smaller budget than the last)
            self._trim_replies(reply_budget)

    def _trim_replies(self, reply_budget: int) -> None:
        """Keep replies only for the newest `REPLY_MEMORY` ids, newest first while they fit `reply_budget`."""
        handled = self.handled
        # Older entries hold no reply already (each call clears the one leaving the window; see also
        # `_with_recent_replies`), so only the newest REPLY_MEMORY + 1 need a look.
        size = 0
        newest = islice(reversed(handled.items()), REPLY_MEMORY + 1)
        for position, (mid, stored) in enumerate(newest):  # setting a value keeps the order
            if stored is None:
                continue
            if position < REPLY_MEMORY and size + len(stored) <= reply_budget:
                size += len(stored)
            else:
                handled[mid] = None
        self._kept = size

    def document(self, state: StateParts | bytes) -> bytes:
        """The checkpoint's bytes for `state` (`encoded_state()`)."""
        state_bytes = join_parts(state) if isinstance(state, dict) else state
        doc = _CheckpointOut(
            state=msgspec.Raw(state_bytes),
            handled=list(self.handled.items()),
            log_seq=self.log_seq,
            progress_seq=self.progress_seq,
        )
        return _encode(doc)


class _LogTurn:
    """One turn at an activation's EventLog; the lock is made for the first user and let go by the last."""

    __slots__ = ("_activation", "_lock")

    def __init__(self, activation: Activation) -> None:
        self._activation = activation
        lock = activation._log_lock
        if lock is None:
            lock = activation._log_lock = asyncio.Lock()
        activation._log_users += 1
        self._lock = lock

    async def __aenter__(self) -> None:
        try:
            await self._lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._leave()

    def _leave(self) -> None:
        activation = self._activation
        activation._log_users -= 1
        if activation._log_users == 0:  # nobody holds or waits for it: the next user makes a new one
            activation._log_lock = None


async def _both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Await two reads at once with one task, not `asyncio.gather`'s two and its gathering future (a new
    activation's two reads; ≈ 10 µs of a worker's CPU per activation). When the second fails the first is
    cancelled; its outcome is always retrieved."""
    started = asyncio.ensure_future(first)
    started.add_done_callback(_retrieve)
    try:
        other = await second
    except BaseException:
        started.cancel()
        raise
    return await started, other


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved: a failure the caller never awaited is not logged at exit


def _with_recent_replies(handled: list[tuple[str, bytes | None]]) -> OrderedDict[str, bytes | None]:
    """The handled-message memory of a loaded checkpoint, replies kept only for the newest REPLY_MEMORY.

    Checkpoints written before REPLY_MEMORY existed kept a reply for every id; `remember` relies on older
    entries holding none.
    """
    memory = OrderedDict(handled)
    for message_id in list(memory)[:-REPLY_MEMORY]:
        memory[message_id] = None
    return memory


class LoggedCommit(msgspec.Struct, frozen=True):
    """A message committed by its EventLog append alone, as an activation reads it back."""

    message_id: str
    #: Its encoded reply, when it was kept.
    reply: bytes | None = None
    #: Its state delta (`_delta.py`); None: the state did not change.
    delta: str | None = None
    #: The progress sequence after it, when it moved.
    progress_seq: int | None = None


class LoggedSince(msgspec.Struct, frozen=True):
    """What an agent's EventLog holds after its checkpoint's sequence."""

    #: Messages logged without their commit completing (the worker died before the checkpoint).
    logged: frozenset[str]
    #: Messages committed by the append alone, oldest first.
    committed: list[LoggedCommit]
    #: The last sequence read (the log may have grown since its last sequence was asked).
    last_seq: int = 0


class ActivationTable:
    """Live activations of one worker, created lazily and passivated when idle."""

    def __init__(
        self,
        checkpoints: CheckpointStore,
        key_of: Any,
        last_log_seq: Callable[[AgentId], Awaitable[int]] | None = None,
        logged_since: Callable[[AgentId, int], Awaitable[LoggedSince]] | None = None,
    ) -> None:
        self._checkpoints = checkpoints
        self._key_of = key_of
        self._last_log_seq = last_log_seq
        self._logged_since = logged_since
        self._live: dict[AgentId, Activation] = {}

    def __len__(self) -> int:
        return len(self._live)

    def get(self, agent_id: AgentId) -> Activation | None:
        return self._live.get(agent_id)

    async def activate(self, agent_id: AgentId, agent_type: AgentType) -> Activation:
        found = self._live.get(agent_id)
        if found is not None:
            found.last_used = time.monotonic()
            return found
        agent = await agent_type.create(agent_id)
        # A stateless (durable=False) type has no checkpoint and commits no EventLog entries: touch no KV.
        stored, last = None, 0
        if agent_type.durable:
            load = self._checkpoints.load(self._key_of(agent_id))
            if self._last_log_seq is not None:
                # Both at once (one round trip): whichever order a late write of a dying owner falls in,
                # the larger sequence wins below and the entries after the checkpoint are read back.
                stored, last = await _both(load, self._last_log_seq(agent_id))
            else:
                stored = await load
        doc = CheckpointDoc() if stored is None else _decode(stored.state)
        # The log may be ahead of the checkpoint (commits write none as a rule; a worker may have died between
        # its append and its checkpoint): the activation continues from the log's end, fenced there.
        log_seq = max(doc.log_seq, last)
        since = LoggedSince(NO_IDS, [])
        if log_seq > doc.log_seq and self._logged_since is not None:
            # Messages committed by their append alone join the handled-message memory; those a dead worker
            # logged but never checkpointed are recognised, so their redelivery does not append the same
            # entries a second time.
            since = await self._logged_since(agent_id, doc.log_seq)
            # What was read is what the state is rebuilt from: expect the log to end there, so an append
            # that slipped in between (a zombie's) fences our next commit instead of being applied twice.
            log_seq = max(log_seq, since.last_seq)
        state, progress_seq = dict(doc.state), doc.progress_seq
        for commit in since.committed:  # the state as of the last commit: the checkpoint and its deltas
            if commit.delta is not None:
                apply_delta(state, commit.delta)
            if commit.progress_seq is not None:
                progress_seq = commit.progress_seq
        if state:
            agent.load_state(state)
        activation = Activation(
            agent_id=agent_id,
            agent=agent,
            agent_type=agent_type,
            revision=None if stored is None else stored.revision,
            log_seq=log_seq,
            progress_seq=progress_seq,
            handled=_with_recent_replies(doc.handled),
            saved=b"",
            logged=since.logged,
            unsaved=len(since.committed),
            saved_progress_seq=progress_seq,
        )
        activation.saved = activation.encoded_state()
        for commit in since.committed:
            activation.remember(commit.message_id, commit.reply, reply_budget=REPLY_MEMORY * REPLY_MAX_BYTES)
        await agent.on_activate(agent_id)
        self._live[agent_id] = activation
        if metrics_enabled():
            INSTRUMENTS.activations.add(1, {"agent_type": agent_id.type})
        return activation

    async def save(self, activation: Activation, *, state: StateParts | bytes | None = None) -> None:
        """Write the checkpoint by compare-and-swap on the revision (a zombie's write fails); `state`: the
        agent's state as the caller has just encoded it (`encoded_state()`)."""
        if state is None:
            state = activation.encoded_state()
        doc = activation.document(state)
        activation.revision = await self._checkpoints.save(
            self._key_of(activation.agent_id), doc, expected_revision=activation.revision
        )
        activation.saved = state
        activation.saved_progress_seq = activation.progress_seq
        activation.unsaved = 0

    def of_type(self, agent_type: str) -> list[Activation]:
        return [a for a in self._live.values() if a.agent_id.type == agent_type]

    def drop(self, agent_id: AgentId) -> None:
        if self._live.pop(agent_id, None) is not None and metrics_enabled():
            INSTRUMENTS.activations.add(-1, {"agent_type": agent_id.type})

    def compact(self) -> None:
        """Rebuild the table at its present size: a dict never shrinks, and after a burst of keys its
        table is sized for the peak (≈ 40 B per activation ever live at once)."""
        self._live = dict(self._live)

    def idle(self, older_than_s: float, busy: set[AgentId]) -> list[Activation]:
        now = time.monotonic()
        return [a for a in self._live.values() if now - a.last_used > older_than_s and a.agent_id not in busy]

    def oldest(self, n: int, busy: set[AgentId]) -> list[Activation]:
        candidates = sorted(
            (a for a in self._live.values() if a.agent_id not in busy), key=lambda a: a.last_used
        )
        return candidates[:n]
