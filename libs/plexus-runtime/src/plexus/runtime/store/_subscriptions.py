"""Topic subscriptions in ``plexus_subscriptions`` with AutoGen's semantics.

A `TypeSubscription` maps topic type T to agent type A: a publication on ``TopicId(T, source)`` goes to
``AgentId(A, key=source)``. A `TypePrefixSubscription` does the same for every topic type starting with a
prefix. Subscriptions are namespaced: a topic reaches only subscriptions of its own namespace. A publication
is never delivered back to its sender.

Publishers resolve recipients on the hot path, so `SubscriptionTable` answers `recipients` from memory after
`start()`, kept current by a KV watch; changes made by other processes arrive through that watch.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TypeAlias

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from ulid import ULID

from plexus.core import DEFAULT_NAMESPACE, AgentId, TopicId
from plexus.runtime.wire._subjects import escape_token

from ._registry import KVMirror, kv_snapshot

__all__ = [
    "Subscription",
    "SubscriptionNotFoundError",
    "SubscriptionTable",
    "TypePrefixSubscription",
    "TypeSubscription",
]


def _new_id() -> str:
    return str(ULID())


def _check(namespace: str, agent_type: str, topic_type: str, sub_id: str) -> None:
    # AgentId / TopicId own the naming rules; building them raises a ValueError naming the bad part.
    AgentId(agent_type, "_", namespace)
    TopicId(topic_type, "_", namespace)
    if not sub_id:
        raise ValueError("subscription id must not be empty")


class TypeSubscription(msgspec.Struct, frozen=True, kw_only=True, tag="type", tag_field="kind"):
    """Topic type `topic_type` → agent type `agent_type`; the recipient's key is the topic's source."""

    topic_type: str
    agent_type: str
    namespace: str = DEFAULT_NAMESPACE
    id: str = msgspec.field(default_factory=_new_id)

    def __post_init__(self) -> None:
        _check(self.namespace, self.agent_type, self.topic_type, self.id)

    def matches(self, topic: TopicId) -> bool:
        return topic.namespace == self.namespace and topic.type == self.topic_type

    def recipient(self, topic: TopicId) -> AgentId:
        return AgentId(self.agent_type, topic.source, self.namespace)


class TypePrefixSubscription(msgspec.Struct, frozen=True, kw_only=True, tag="prefix", tag_field="kind"):
    """Every topic type starting with `topic_type_prefix` → agent type `agent_type` (key = topic source)."""

    topic_type_prefix: str
    agent_type: str
    namespace: str = DEFAULT_NAMESPACE
    id: str = msgspec.field(default_factory=_new_id)

    def __post_init__(self) -> None:
        # The prefix must itself be a valid topic type, which also rules out the match-everything "".
        _check(self.namespace, self.agent_type, self.topic_type_prefix, self.id)

    def matches(self, topic: TopicId) -> bool:
        return topic.namespace == self.namespace and topic.type.startswith(self.topic_type_prefix)

    def recipient(self, topic: TopicId) -> AgentId:
        return AgentId(self.agent_type, topic.source, self.namespace)


Subscription: TypeAlias = TypeSubscription | TypePrefixSubscription

_decoder = msgspec.json.Decoder(Subscription)
_RESOLVED_MAX = 4096
_encoder = msgspec.json.Encoder()


class SubscriptionNotFoundError(KeyError):
    """No subscription with this id exists."""

    def __init__(self, subscription_id: str) -> None:
        self.subscription_id = subscription_id
        super().__init__(subscription_id)

    def __str__(self) -> str:  # KeyError would print only the quoted id
        return f"no subscription with id {self.subscription_id!r}"


def _key(subscription_id: str) -> str:
    return escape_token(subscription_id)


def _resolve(subs: list[Subscription], topic: TopicId, sender: AgentId | None) -> list[AgentId]:
    seen: set[AgentId] = set()
    out: list[AgentId] = []
    for sub in subs:
        if not sub.matches(topic):
            continue
        agent = sub.recipient(topic)
        if agent == sender or agent in seen:
            continue
        seen.add(agent)
        out.append(agent)
    return out


class SubscriptionTable:
    """The cluster's subscriptions. Writes go to KV; `recipients` reads the watch-backed cache."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._mirror: KVMirror[Subscription] = KVMirror(kv, _decoder.decode)
        # (namespace, topic type) -> matching subscriptions, rebuilt lazily when the mirror changes.
        self._exact: dict[tuple[str, str], list[Subscription]] = {}
        self._prefixed: list[TypePrefixSubscription] = []
        self._indexed_version = -1
        # (namespace, topic type, source, sender) -> recipients; emptied whenever the subscriptions change.
        self._resolved: dict[tuple[str, str, str, str | None], list[AgentId]] = {}

    async def start(self) -> None:
        """Load every subscription and follow changes; returns once the cache holds the current contents."""
        await self._mirror.start()

    async def stop(self) -> None:
        await self._mirror.stop()

    async def add(self, sub: Subscription) -> str:
        """Store `sub` and return its id. Adding the same subscription again is a no-op."""
        key = _key(sub.id)
        data = _encoder.encode(sub)
        try:
            revision = await self._kv.create(key, data)
        except KeyWrongLastSequenceError:
            existing = await self._kv.get(key)
            if existing.value and _decoder.decode(existing.value) == sub:
                return sub.id
            raise ValueError(f"subscription id {sub.id!r} is taken by a different subscription") from None
        if self._mirror.started:
            self._mirror.apply(key, data, revision)  # read-your-writes before the watch catches up
        return sub.id

    async def remove(self, subscription_id: str) -> None:
        """Delete a subscription; an unknown id raises `SubscriptionNotFoundError`."""
        key = _key(subscription_id)
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            raise SubscriptionNotFoundError(subscription_id) from None
        await self._kv.delete(key)
        if self._mirror.started:
            self._mirror.apply(key, None, entry.revision)

    async def list(self, namespace: str | None = None) -> list[Subscription]:
        """All subscriptions (of `namespace`), oldest first; read from KV unless the cache is running."""
        if self._mirror.started:
            subs = list(self._mirror.items.values())
        else:
            subs = [_decoder.decode(v) for v in (await kv_snapshot(self._kv)).values()]
        return sorted((s for s in subs if namespace is None or s.namespace == namespace), key=lambda s: s.id)

    def recipients(self, topic: TopicId, sender: AgentId | None = None) -> builtins.list[AgentId]:
        """Where a publication on `topic` goes: deduplicated, in subscription order, minus `sender`."""
        if not self._mirror.started:
            raise RuntimeError("SubscriptionTable is not started; await start() first")
        self._reindex()
        key = (topic.namespace, topic.type, topic.source, str(sender) if sender is not None else None)
        cached = self._resolved.get(key)
        if cached is not None:
            return list(cached)
        exact = self._exact.get((topic.namespace, topic.type), [])
        candidates: builtins.list[Subscription] = [*exact, *self._prefixed]
        candidates.sort(key=lambda s: s.id)
        resolved = _resolve(candidates, topic, sender)
        if len(self._resolved) >= _RESOLVED_MAX:
            self._resolved.clear()  # bounded: a publisher cycling through many sources never grows it
        self._resolved[key] = resolved
        return list(resolved)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait (without polling) until `predicate()` holds after some change; False at the deadline."""
        return await self._mirror.wait_until(predicate, timeout)

    def _reindex(self) -> None:
        if self._indexed_version == self._mirror.signal.version:
            return
        exact: dict[tuple[str, str], list[Subscription]] = {}
        prefixed: list[TypePrefixSubscription] = []
        for sub in self._mirror.items.values():
            if isinstance(sub, TypeSubscription):
                exact.setdefault((sub.namespace, sub.topic_type), []).append(sub)
            else:
                prefixed.append(sub)
        self._exact, self._prefixed = exact, prefixed
        self._resolved.clear()
        self._indexed_version = self._mirror.signal.version
