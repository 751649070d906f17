"""A KV bucket mirrored in memory and kept current by a watch (`KVMirror`), one-shot scans (`kv_snapshot`),
and the change signal their readers wait on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

__all__ = [
    "SNAPSHOT_CONSUMER_TTL_S",
    "WATCH_CONSUMER_TTL_S",
    "ChangeSignal",
    "KVMirror",
    "kv_keys",
    "kv_snapshot",
]

_log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a one-shot scan of a bucket may take before the server is considered unreachable.
_SCAN_TIMEOUT_S = 5.0


def _is_delete(entry: KeyValue.Entry) -> bool:
    # Server-placed limit markers carry no value; our values are never empty, so empty means gone.
    return entry.operation in (KV_DEL, KV_PURGE) or not entry.value


#: How long the server keeps a one-shot scan's consumer after the scan stopped reading.
SNAPSHOT_CONSUMER_TTL_S = 5.0
#: The same for a long-lived watch (a stopped one must not linger for nats-py's default 5 minutes).
WATCH_CONSUMER_TTL_S = 30.0


async def kv_snapshot(kv: KeyValue, keys: str = ">", timeout_s: float = _SCAN_TIMEOUT_S) -> dict[str, bytes]:
    """The current value of every live key matching `keys`, read in one watch pass (not one get per key).

    nats-py's watcher can report "end of initial values" while a key that was rewritten during the scan
    (history 1: its old revision is gone) is still in flight, so the result is cross-checked against the
    stream's subject list and any key missing from the pass is read directly.
    """
    # Gone 5 s after the scan (nats-py's default keeps a stopped watch's consumer for 5 minutes: periodic
    # snapshots then piled up hundreds of consumers and hit the server's limit; found by `make chaos`).
    watcher = await kv.watch(keys, ignore_deletes=True, inactive_threshold=SNAPSHOT_CONSUMER_TTL_S)
    out: dict[str, bytes] = {}
    try:
        while True:
            entry: KeyValue.Entry | None = await watcher.updates(timeout=timeout_s)  # type: ignore[no-untyped-call]
            if entry is None:  # end of the initial values
                break
            if _is_delete(entry):
                out.pop(entry.key, None)
            else:
                out[entry.key] = entry.value or b""
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    out.update(await _missed(kv, keys, out.keys()))
    return out


async def kv_keys(kv: KeyValue, keys: str = ">", timeout_s: float = _SCAN_TIMEOUT_S) -> list[str]:
    """The live keys matching `keys`, sorted, from one metadata-only watch pass (values are not read),
    cross-checked against the stream's subject list like `kv_snapshot` (a key in flight when nats-py said
    "end of initial values" was once missed: a run list or a worker's partitions came back empty)."""
    watcher = await kv.watch(
        keys, ignore_deletes=True, meta_only=True, inactive_threshold=SNAPSHOT_CONSUMER_TTL_S
    )
    seen: set[str] = set()
    try:
        while True:
            entry: KeyValue.Entry | None = await watcher.updates(timeout=timeout_s)  # type: ignore[no-untyped-call]
            if entry is None:
                break
            if not _is_delete(entry):
                seen.add(entry.key)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    seen.update(await _missed(kv, keys, seen))
    return sorted(seen)


async def _missed(kv: KeyValue, keys: str, known: Iterable[str]) -> dict[str, bytes]:
    """Live keys matching `keys` that the stream holds but a watch pass did not deliver, read directly."""
    known = set(known)
    prefix = kv._pre  # "$KV.<bucket>." — nats-py exposes no public accessor for it
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{prefix}{keys}")
    out: dict[str, bytes] = {}
    for subject in info.state.subjects or {}:
        key = subject[len(prefix) :]
        if key in known:
            continue
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            continue
        if entry is not None and not _is_delete(entry):
            out[key] = entry.value or b""
    return out


class ChangeSignal:
    """Wakes waiters whenever something changes, so they re-check a condition instead of polling."""

    def __init__(self) -> None:
        self.version = 0
        self._changed = asyncio.Event()

    def notify(self) -> None:
        # Wake every current waiter; later waiters wait on the fresh event.
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait for `predicate()` to hold, re-checking on every change; False once `timeout` passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if predicate():
                return True
            changed = self._changed
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return predicate()


class KVMirror(Generic[T]):
    """An in-memory ``key -> decoded value`` view of a bucket, kept current by a KV watch.

    Writers in this process may `apply` their own writes at once (read-your-writes); per-key revisions make
    the watch's later copy of the same write, or any older one, a no-op. Every change fires `signal`, which
    several mirrors may share.
    """

    def __init__(
        self, kv: KeyValue, decode: Callable[[bytes], T], keys: str = ">", signal: ChangeSignal | None = None
    ) -> None:
        self._kv = kv
        self._decode = decode
        self._keys = keys
        self._items: dict[str, T] = {}
        self._revisions: dict[str, int] = {}
        self.signal = signal or ChangeSignal()
        self._ready = asyncio.Event()
        self._watcher: KeyValue.KeyWatcher | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def items(self) -> Mapping[str, T]:
        return MappingProxyType(self._items)

    @property
    def started(self) -> bool:
        return self._task is not None

    async def start(self, timeout_s: float = _SCAN_TIMEOUT_S) -> None:
        """Start watching and return once the bucket's current contents are loaded."""
        if self._task is not None:
            return
        # Forget a previous run: keys that expired meanwhile left no event to remove them.
        self._items.clear()
        self._revisions.clear()
        self._ready = asyncio.Event()
        self._watcher = await self._kv.watch(self._keys, inactive_threshold=WATCH_CONSUMER_TTL_S)
        self._task = asyncio.create_task(self._run(self._watcher), name=f"kv-mirror:{self._keys}")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
            await self._catch_up(self._watcher, timeout_s)
        except TimeoutError:
            await self.stop()
            raise

    async def _catch_up(self, watcher: KeyValue.KeyWatcher, timeout_s: float) -> None:
        """nats-py says "loaded" once its consumer has nothing *pending*, but entries the server has already
        sent and this client has not read yet are not pending either: a key written just before the watch
        began could be missing from a mirror that said it was loaded (seen under load). Wait until every
        entry delivered so far has been read and applied."""
        sub: Any = getattr(watcher, "_sub", None)
        updates: Any = getattr(watcher, "_updates", None)
        if sub is None or updates is None:  # another nats-py: keep its own notion of loaded
            return
        target = (await sub.consumer_info()).delivered.consumer_seq
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (sub.delivered < target or not updates.empty()) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)  # the last entry read is applied by `_run` on its next turn

    async def stop(self) -> None:
        watcher, task = self._watcher, self._task
        self._watcher = self._task = None
        if watcher is not None:
            with contextlib.suppress(Exception):  # the connection may already be closed
                await watcher.stop()  # type: ignore[no-untyped-call]
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:
                self._ready.set()
                self.signal.notify()
                continue
            value = None if _is_delete(entry) else entry.value
            self.apply(entry.key, value, entry.revision)

    def apply(self, key: str, value: bytes | None, revision: int | None) -> None:
        """Apply one write (``value=None`` deletes) unless a newer revision of `key` was applied already."""
        if revision is not None:
            known = self._revisions.get(key, 0)
            # A local delete is applied at the revision it removed, so it must win over that same revision.
            if revision < known or (revision == known and value is not None):
                return
            self._revisions[key] = revision
        if value is None:
            self._items.pop(key, None)
        else:
            try:
                self._items[key] = self._decode(value)
            except ValueError as exc:
                _log.warning("ignoring undecodable KV value at %s: %s", key, exc)
                self._items.pop(key, None)
        self.signal.notify()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        return await self.signal.wait_until(predicate, timeout)
