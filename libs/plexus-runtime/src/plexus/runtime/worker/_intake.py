"""Intake: turn a received NATS message into one unit of work, or dead-letter it with a typed answer.

Every check a message must pass before a handler may see it lives here: the wire decode, the target, the
subject it arrived on, ids usable in EventLog entries, and the reply address. Any exception while reading a
message is bad input (dead-lettered and acked), never a crash of the worker or a leaked handler slot; a reply
is only ever published to a reply subject (`_INBOX.…`), never into Plexus's own state subjects.
"""

from __future__ import annotations

import contextlib
import logging

import msgspec
from nats.aio.msg import Msg

from plexus.core import AgentId, AgentNotFoundError, BaseBlock, ProtocolError, TopicId
from plexus.runtime._app import App
from plexus.runtime.client._supervisor import new_root_run
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._schedules import HDR_SCHEDULER, fired_id
from plexus.runtime.wire._envelope import (
    HDR_MSG_ID,
    RESEND,
    RESEND_PROBE,
    Envelope,
    Reply,
    WireError,
    blocks_from_payload,
    decode_envelope,
    encode_reply,
    topic_copy_id,
)
from plexus.runtime.wire._subjects import SubjectTooLongError, checkpoint_key, reply_subject_problem

from ._deadletter import dead_letter
from ._recent_replies import RecentReplies
from ._work import _envelope_problem, _id_problem, _origin_problem
from .pipeline._work import Work

__all__ = ["Intake"]

log = logging.getLogger("plexus.worker")

_JS_PREFIX = "$JS."


class Intake:
    """Reads messages for the agent types of `app` hosted by worker `worker_id`."""

    def __init__(self, app: App, connection: Connection, worker_id: str) -> None:
        self.app = app
        self.connection = connection
        self.worker_id = worker_id
        #: Stopped with the worker (`Worker.stop` closes it).
        self.recent_replies = RecentReplies(connection)

    async def read(self, msg: Msg, *, durable: bool) -> Work | None:
        """The work `msg` carries, or None when it was dead-lettered (and answered, and acked)."""
        try:
            return await self._read(msg, durable)
        except Exception as exc:  # a check we did not foresee: still bad input, never a stuck message
            log.exception("intake of a message on %s failed", msg.subject)
            await self.dead_letter(msg, "garbage", f"{type(exc).__name__}: {exc}", None)
            return None

    async def read_publication(self, msg: Msg, agent_types: list[str]) -> list[Work]:
        """The copies of topic publication `msg` (one message for all its stateless recipients) for the
        hosted `agent_types`: each addressed to the key of the topic's source, with the per-recipient message
        id ``<publication id>.<type>``. What all copies share is decoded and checked once; a publication that
        fails those checks is dead-lettered once."""
        try:
            return await self._read_publication(msg, agent_types)
        except Exception as exc:  # a check we did not foresee: still bad input, never a stuck message
            log.exception("intake of a publication on %s failed", msg.subject)
            await self.dead_letter(msg, "garbage", f"{type(exc).__name__}: {exc}", None)
            return []

    async def _read(self, msg: Msg, durable: bool) -> Work | None:
        core_reply = None if durable else msg.reply
        if core_reply and not await self._reply_ok(msg, core_reply):
            return None
        try:
            env = decode_envelope(msg.data, msg.headers)
        except WireError as exc:
            await self.dead_letter(msg, exc.reason, str(exc), None)
            return None
        if env.reply_to is not None and not await self._reply_ok(msg, env.reply_to, env):
            return None
        if durable and msg.headers and HDR_SCHEDULER in msg.headers:
            # Fired by a schedule (docs/schedules.md): each fire of a reminder is a message of its own.
            env = msgspec.structs.replace(env, id=fired_id(env.id, msg.headers))
        try:
            agent_id = AgentId.parse(env.target)
        except ValueError as exc:
            await self.dead_letter(msg, "target", str(exc), env)
            return None
        agent_type = self.app.get(agent_id.type)
        if agent_type is None or agent_type.namespace != agent_id.namespace:
            await self.dead_letter(msg, "unregistered", f"no agent type {agent_id.type!r} here", env)
            await self.reply(
                env, msg, Reply(id=env.id, ok=False, error=AgentNotFoundError(agent_id).to_wire())
            )
            return None
        if not self._arrived_for(msg.subject, agent_id, durable):
            # Running it would activate the agent from another key's partition: two activations at once.
            await self.dead_letter(msg, "target", f"{env.target!r} arrived on {msg.subject!r}", env)
            return None
        if not await self._key_ok(msg, agent_id, env):
            return None
        problem = _envelope_problem(env)
        if problem is not None:
            # Caught here, not when the EventLog entry fails to validate at commit: that would leave the
            # message unacked and redeliver it forever.
            await self.dead_letter(msg, "schema", problem, env)
            return None
        try:  # built here, not in the handler: blocks that fail to validate are bad input
            blocks = blocks_from_payload(env.payload)
        except WireError as exc:
            await self.dead_letter(msg, exc.reason, str(exc), env)
            return None
        if env.run is None:  # a foreign sender may omit it: the message starts a run, as a client's does
            env = msgspec.structs.replace(env, run=new_root_run())
        return Work(
            msg=msg, env=env, agent_type=agent_type, agent_id=agent_id, durable=durable, blocks=blocks
        )

    async def _read_publication(self, msg: Msg, agent_types: list[str]) -> list[Work]:
        if msg.reply and not await self._reply_ok(msg, msg.reply):
            return []
        try:
            env = decode_envelope(msg.data, msg.headers)
        except WireError as exc:
            await self.dead_letter(msg, exc.reason, str(exc), None)
            return []
        topic = self._topic_of(msg.subject, env)
        if isinstance(topic, str):
            await self.dead_letter(msg, "topic", topic, env)
            return []
        if env.reply_to is not None and not await self._reply_ok(msg, env.reply_to, env):
            return []
        # The sender's and the run's ids, as every copy carries them (each copy's own id is checked below).
        problem = _origin_problem(env)
        if problem is not None:
            await self.dead_letter(msg, "schema", problem, env)
            return []
        try:
            blocks = blocks_from_payload(env.payload)
        except WireError as exc:
            await self.dead_letter(msg, exc.reason, str(exc), env)
            return []
        if env.run is None:  # one run for the publication, shared by all its copies
            env = msgspec.structs.replace(env, run=new_root_run())
        # A copy's id is the publication's, a dot and a type name (no whitespace; never a minted id of
        # another kind): when the longest is a valid message id, every one is.
        copy_ids_ok = _id_problem(topic_copy_id(env.id, max(agent_types, key=len))) is None
        works = []
        for name in agent_types:
            work = await self._topic_copy(msg, env, topic, name, blocks, copy_ids_ok)
            if work is not None:
                works.append(work)
        return works

    def _topic_of(self, subject: str, env: Envelope) -> TopicId | str:
        """The topic publication `env` was published to, or what is wrong with it."""
        if env.kind != "publish" or env.topic is None:
            return f"a {env.kind!r} envelope without a topic arrived on topic subject {subject!r}"
        try:
            topic = TopicId.parse(env.topic)
        except ValueError as exc:
            return f"topic {env.topic!r}: {exc}"
        if topic.namespace != self.app.namespace:
            return f"topic {env.topic!r} is not of namespace {self.app.namespace!r}"
        if subject != self.connection.subjects_for(topic.namespace).topic(topic.type, topic.source):
            return f"topic {env.topic!r} arrived on {subject!r}"
        return topic

    async def _topic_copy(
        self, msg: Msg, env: Envelope, topic: TopicId, name: str, blocks: list[BaseBlock], id_ok: bool
    ) -> Work | None:
        """Agent type `name`'s copy of publication `env`, or None when that copy was dead-lettered."""
        copy_id = topic_copy_id(env.id, name)
        try:
            agent_id = AgentId.parse(f"{topic.namespace}/{name}/{topic.source}")  # parsed ids are cached
        except ValueError as exc:
            await self.dead_letter(msg, "target", str(exc), msgspec.structs.replace(env, id=copy_id))
            return None
        copy = msgspec.structs.replace(env, id=copy_id, target=str(agent_id))
        agent_type = self.app.get(name)
        if agent_type is None or agent_type.namespace != agent_id.namespace:
            await self.dead_letter(msg, "unregistered", f"no agent type {name!r} here", copy)
            return None
        if not await self._key_ok(msg, agent_id, copy):
            return None
        problem = None if id_ok else _id_problem(copy_id)
        if problem is not None:
            await self.dead_letter(msg, "schema", problem, copy)
            return None
        # Blocks are frozen; each handler gets its own list.
        return Work(
            msg=msg, env=copy, agent_type=agent_type, agent_id=agent_id, durable=False, blocks=list(blocks)
        )

    async def _reply_ok(self, msg: Msg, address: str, env: Envelope | None = None) -> bool:
        """Whether replies may go to `address`; dead-letters the message when not (with `env`, whose reply
        address is then dropped: answering would publish to an address we refuse, so a caller times out)."""
        problem = reply_subject_problem(address)
        if problem is None:
            return True
        await self.dead_letter(
            msg, "reply_to", problem, None if env is None else msgspec.structs.replace(env, reply_to=None)
        )
        return False

    async def _key_ok(self, msg: Msg, agent_id: AgentId, env: Envelope) -> bool:
        """Whether `agent_id`'s checkpoint key fits a subject (else its activation could never load one)."""
        try:
            checkpoint_key(agent_id.namespace, agent_id.type, agent_id.key)
        except SubjectTooLongError as exc:
            await self.dead_letter(msg, "target", str(exc), env)
            return False
        return True

    def _arrived_for(self, subject: str, agent_id: AgentId, durable: bool) -> bool:
        """Whether `subject` is the inbox of `agent_id` (the one its partition and mailbox follow)."""
        subjects = self.connection.subjects_for(agent_id.namespace)
        try:
            if durable:
                agent_type, key, _ = subjects.parse_partitioned(subject)
            else:
                agent_type, key = subjects.parse_ephemeral(subject)
        except ValueError:
            return False
        return (agent_type, key) == (agent_id.type, agent_id.key)

    async def dead_letter(self, msg: Msg, reason: str, detail: str, env: Envelope | None) -> None:
        """Copy `msg` to the dead-letter stream, answer a typed error where a reply address is known, ack."""
        if not await self.dlq_copy(msg, reason, detail, env):
            return
        error = ProtocolError(f"message rejected ({reason}): {detail}")
        if env is not None and reason != "unregistered":
            await self.reply(env, msg, Reply(id=env.id, ok=False, error=error.to_wire()))
        elif env is None and msg.reply and not msg.reply.startswith(_JS_PREFIX):
            # A core request names its reply address outside the body: answer even undecodable bytes.
            msg_id = (msg.headers or {}).get(HDR_MSG_ID, "")
            await self.publish_reply(
                msg.reply, encode_reply(Reply(id=msg_id[:256], ok=False, error=error.to_wire()))
            )
        if msg.reply and msg.reply.startswith("$JS.ACK"):
            with contextlib.suppress(Exception):  # not acked: redelivered and dead-lettered again
                await msg.ack()

    async def dlq_copy(self, msg: Msg, reason: str, detail: str, env: Envelope | None) -> bool:
        """Publish a copy of `msg` with the reason to the dead-letter stream; False if that failed."""
        subjects = self.connection.subjects_for(self.app.namespace)
        return await dead_letter(self.connection, subjects, self.worker_id, msg, reason, detail, env)

    async def reply(self, env: Envelope, msg: Msg, reply: Reply) -> None:
        # The same preference as `Work.reply_to`: a core requester waits on msg.reply, not on the body's.
        core = None if (msg.reply or "").startswith(_JS_PREFIX) else msg.reply
        target = core or env.reply_to
        if target:
            await self.publish_reply(target, encode_reply(reply))

    async def answer_unkept_resend(self, work: Work, seen: bool) -> None:
        """Answer a resend (`RESEND`) of a message whose reply its agent does not keep. A probe for one not
        handled yet gets no answer: its own handling answers the caller (reconnected by now). Otherwise the
        agent no longer remembers it, or did not keep its reply: answering by running the handler could run
        it twice, so the caller gets a typed error instead."""
        env = work.env
        if env.metadata.get(RESEND) == RESEND_PROBE and not seen:
            return
        error = ProtocolError(f"message {env.id} was handled but its reply is no longer kept")
        if work.reply_to:
            await self.publish_reply(
                work.reply_to, encode_reply(Reply(id=env.id, ok=False, error=error.to_wire()))
            )

    async def publish_reply(self, target: str, data: bytes) -> None:
        """Publish a reply, only ever to a reply subject (the last guard: intake refused the others)."""
        problem = reply_subject_problem(target)
        if problem is not None:
            log.warning("not replying: %s", problem)
            return
        with contextlib.suppress(Exception):  # a caller that went away is not our failure
            await self.connection.nc.publish(target, data)
            self.recent_replies.published(target, data)
