"""Partition ownership through KV leases in ``plexus_leases`` (bucket TTL = lease TTL).

Acquire is an atomic ``create`` (one winner), renew is a compare-and-swap ``update`` on the revision the
holder last wrote, release is a ``delete`` with the same expectation, so a holder whose lease expired and was
taken over can neither renew nor delete the new owner's lease. ``update`` carries no per-message TTL
(nats-facts), so expiry relies on the bucket-level TTL, measured from the last renewal.

`plan_partitions` is the pure fair-share rule; `LeaseKeeper` renews held leases every TTL/3 and reports
losses.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType

import msgspec
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ._registry import kv_snapshot

__all__ = ["Lease", "LeaseKeeper", "LeaseManager", "LeaseRecord", "fair_share", "plan_partitions"]

_log = logging.getLogger(__name__)

# JetStream "wrong last sequence" codes (nats-facts): 10071 names the current sequence, 10164 does not.
_WRONG_LAST_SEQ = (10071, 10164)
# try_acquire retries only while the key flips between deleted and re-created under us.
_ACQUIRE_ATTEMPTS = 4

PartitionCallback = Callable[[int], Awaitable[None] | None]


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The value stored under a lease key. Times are Unix seconds, for operators reading the bucket."""

    owner: str
    acquired_at: float
    renewed_at: float


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """A held lease: `revision` is the KV revision this holder wrote last (the CAS token)."""

    key: str
    owner: str
    revision: int
    acquired_at: float


_decoder = msgspec.json.Decoder(LeaseRecord)
_encoder = msgspec.json.Encoder()


def _wrong_last_seq(exc: APIError) -> bool:
    return isinstance(exc, KeyWrongLastSequenceError) or exc.err_code in _WRONG_LAST_SEQ


class LeaseManager:
    """Acquire, renew, release and inspect leases for one owner. `ttl_s` must equal the bucket TTL."""

    def __init__(self, kv: KeyValue, owner_id: str, ttl_s: float) -> None:
        if not owner_id:
            raise ValueError("owner_id must not be empty")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.kv = kv
        self.owner_id = owner_id
        self.ttl_s = ttl_s

    def _record(self, acquired_at: float) -> bytes:
        record = LeaseRecord(owner=self.owner_id, acquired_at=acquired_at, renewed_at=time.time())
        return _encoder.encode(record)

    async def try_acquire(self, key: str) -> Lease | None:
        """Take `key` if nobody holds it (never held, released, or expired); None if another owner does.

        A lease this owner already holds under another `Lease` object (e.g. a restart with the same id) is
        taken over at once; the old object then fails to renew.
        """
        now = time.time()
        data = self._record(now)
        for _ in range(_ACQUIRE_ATTEMPTS):
            try:
                # create() itself re-creates over a client delete/purge marker.
                revision = await self.kv.create(key, data)
                return Lease(key=key, owner=self.owner_id, revision=revision, acquired_at=now)
            except KeyWrongLastSequenceError:
                pass
            except KeyNotFoundError:
                # nats-py's create() re-reads the key after a refused create; if the lease expired in that
                # instant the read fails. The key is free now: try again.
                continue
            try:
                entry = await self.kv.get(key)
            except KeyNotFoundError:
                continue  # deleted or expired between our create and get: create again
            if entry.value and _decoder.decode(entry.value).owner != self.owner_id:
                return None
            # An empty value is a server limit marker left by expiry: creation is allowed on top of it.
            try:
                revision = await self.kv.update(key, data, last=entry.revision)
            except KeyWrongLastSequenceError:
                continue
            return Lease(key=key, owner=self.owner_id, revision=revision, acquired_at=now)
        return None

    async def renew(self, lease: Lease) -> Lease | None:
        """Extend `lease`; None means it is lost (expired or taken over): stop work on it immediately."""
        try:
            revision = await self.kv.update(lease.key, self._record(lease.acquired_at), last=lease.revision)
        except KeyWrongLastSequenceError:
            return None
        return msgspec.structs.replace(lease, revision=revision)

    async def recover(self, lease: Lease) -> Lease | None:
        """After a renewal whose outcome is unknown (its reply was lost, e.g. in a JetStream leader election):
        the lease, renewed, if the stored record is still this holder's own acquisition, else None.

        The lost renewal may have been applied, leaving `lease.revision` stale although nobody else wrote.
        Only this holder writes records with its owner id and this acquisition time, so such a record is
        ours. Call it only for a lease whose last renewal failed with an unknown outcome: a plain stale
        handle must stay fenced (`renew` refuses it).
        """
        try:
            entry = await self.kv.get(lease.key)
        except KeyNotFoundError:
            return None
        if not entry.value or entry.revision is None:
            return None
        try:
            record = _decoder.decode(entry.value)
        except msgspec.DecodeError:
            return None
        if record.owner != self.owner_id or record.acquired_at != lease.acquired_at:
            return None
        try:
            revision = await self.kv.update(lease.key, self._record(lease.acquired_at), last=entry.revision)
        except KeyWrongLastSequenceError:
            return None
        return msgspec.structs.replace(lease, revision=revision)

    async def release(self, lease: Lease) -> bool:
        """Give `lease` up; False (and nothing deleted) if it is no longer ours."""
        try:
            await self.kv.delete(lease.key, last=lease.revision)
        except APIError as exc:  # delete() does not translate the wrong-last-sequence codes itself
            if _wrong_last_seq(exc):
                return False
            raise
        return True

    async def holder(self, key: str) -> str | None:
        """The owner of `key`, or None if it is free."""
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return None
        return _decoder.decode(entry.value).owner if entry.value else None

    async def holders(self, keys: str = ">") -> dict[str, str]:
        """``key -> owner`` for every held lease matching the KV pattern `keys`, in one pass."""
        out: dict[str, str] = {}
        for key, value in (await kv_snapshot(self.kv, keys)).items():
            with contextlib.suppress(msgspec.DecodeError):
                out[key] = _decoder.decode(value).owner
        return out


def fair_share(partitions: int, worker_id: str, live_workers: Iterable[str]) -> int:
    """`worker_id`'s target: floor(P/N), plus one for the first P % N workers in sorted order (sums to P)."""
    workers = sorted({*live_workers, worker_id})
    base, extra = divmod(partitions, len(workers))
    return base + (1 if workers.index(worker_id) < extra else 0)


def plan_partitions(
    partitions: int,
    my_id: str,
    live_workers: list[str],
    owned: set[int],
    held_by_others: dict[int, str],
) -> tuple[list[int], list[int]]:
    """One worker's rebalancing step: ``(to_acquire, to_release)``, both ascending / descending by number.

    A worker above its `fair_share` releases its highest partitions; one below takes free partitions (held by
    nobody) from the lowest number up. Run by every live worker, this converges to each partition having
    exactly one owner and loads differing by at most one. Partitions numbered ``>= partitions`` (the type
    shrank) are always released. `my_id` counts as live even if missing from `live_workers`.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    share = fair_share(partitions, my_id, live_workers)
    stray = sorted((p for p in owned if not 0 <= p < partitions), reverse=True)
    valid = sorted((p for p in owned if 0 <= p < partitions), reverse=True)
    if len(valid) > share:
        return [], stray + valid[: len(valid) - share]
    free = [p for p in range(partitions) if p not in owned and p not in held_by_others]
    return free[: share - len(valid)], stray


class LeaseKeeper:
    """Holds leases on partitions and renews them every ``ttl/3``; a failed renewal calls `on_lost`.

    A renewal that errors (e.g. the connection is down) is retried on the next tick; once no renewal has
    succeeded for a whole TTL the lease may have expired and been taken, so it is reported lost as well.
    """

    def __init__(
        self,
        manager: LeaseManager,
        key_for: Callable[[int], str],
        *,
        on_acquired: PartitionCallback | None = None,
        on_lost: PartitionCallback | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.manager = manager
        self.key_for = key_for
        self.on_acquired = on_acquired
        self.on_lost = on_lost
        self.interval_s = manager.ttl_s / 3 if interval_s is None else interval_s
        self._leases: dict[int, Lease] = {}
        self._renewed_at: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> Mapping[int, Lease]:
        return MappingProxyType(self._leases)

    async def acquire(self, partition: int) -> bool:
        """Try to take `partition`; on success keep renewing it and call `on_acquired`."""
        if partition in self._leases:
            return True
        lease = await self.manager.try_acquire(self.key_for(partition))
        if lease is None:
            return False
        self._leases[partition] = lease
        self._renewed_at[partition] = asyncio.get_running_loop().time()
        await _call(self.on_acquired, partition)
        return True

    async def release(self, partition: int) -> bool:
        """Stop renewing `partition` and delete its lease; False if it was not (or no longer) ours."""
        lease = self._leases.pop(partition, None)
        self._renewed_at.pop(partition, None)
        return lease is not None and await self.manager.release(lease)

    async def apply(self, to_acquire: Iterable[int], to_release: Iterable[int]) -> None:
        """Carry out a `plan_partitions` result (releases first, so the freed partitions are free at once)."""
        for p in to_release:
            await self.release(p)
        for p in to_acquire:
            await self.acquire(p)

    async def renew_all(self) -> list[int]:
        """One renewal round; returns the partitions lost in it (after calling `on_lost` for each)."""
        loop = asyncio.get_running_loop()
        lost: list[int] = []
        for p, lease in list(self._leases.items()):
            try:
                renewed = await self.manager.renew(lease)
            except Exception as exc:  # transport trouble: the lease may still be ours, retry next tick
                _log.warning("renewing lease %s failed: %s", lease.key, exc)
                if loop.time() - self._renewed_at.get(p, 0.0) < self.manager.ttl_s:
                    continue
                renewed = None
            if self._leases.get(p) is not lease:  # released or replaced while we awaited
                continue
            if renewed is None:
                del self._leases[p]
                self._renewed_at.pop(p, None)
                lost.append(p)
                await _call(self.on_lost, p)
            else:
                self._leases[p] = renewed
                self._renewed_at[p] = loop.time()
        return lost

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"lease-keeper:{self.manager.owner_id}")

    async def stop(self, *, release: bool = True) -> None:
        """Stop renewing; with `release` also delete every held lease so others can take it at once."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if release:
            for p in list(self._leases):
                with contextlib.suppress(Exception):  # best effort: an unreleased lease expires by itself
                    await self.release(p)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.renew_all()


async def _call(callback: PartitionCallback | None, partition: int) -> None:
    if callback is None:
        return
    try:
        result = callback(partition)
        if inspect.isawaitable(result):
            await result
    except Exception:  # a callback's bug must not stop the renewals of the other partitions
        _log.exception("lease callback %r failed for partition %d", callback, partition)
