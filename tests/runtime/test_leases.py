"""Partition leases against a real nats-server, and the pure fair-share plan."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.js.kv import KeyValue

from plexus.runtime.store._leases import Lease, LeaseKeeper, LeaseManager, fair_share, plan_partitions

KEY = "default.echo.0"


async def make_kv(
    nc: Client, bucket: str, ttl: float | None = None, marker_ttl: float | None = None
) -> KeyValue:
    """A leases-like bucket: history 1, bucket-level TTL (what `_topology` creates in production)."""
    return await nc.jetstream().create_key_value(
        bucket=bucket, history=1, ttl=ttl, limit_marker_ttl=marker_ttl
    )


@pytest.fixture
async def conns(nats_url: str) -> AsyncIterator[tuple[Client, Client]]:
    a, b = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def eventually(check: Callable[[], Awaitable[bool]], deadline_s: float = 15.0) -> None:
    """Re-check until true; only for server-side expiry, which emits no event we could await."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not await check():
        assert loop.time() < end, "condition not reached before the deadline"
        await asyncio.sleep(0.1)


# -- LeaseManager ----------------------------------------------------------------------------------------
async def test_two_managers_race_for_one_key_one_wins(conns: tuple[Client, Client]) -> None:
    kv_a = await make_kv(conns[0], "leases", ttl=30)
    kv_b = await conns[1].jetstream().key_value("leases")
    a, b = LeaseManager(kv_a, "w-a", 30), LeaseManager(kv_b, "w-b", 30)
    for i in range(10):
        key = f"default.echo.{i}"
        results = await asyncio.gather(a.try_acquire(key), b.try_acquire(key))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        assert await a.holder(key) == winners[0].owner
        assert await b.holder(key) == winners[0].owner


async def test_renew_is_compare_and_swap(conns: tuple[Client, Client]) -> None:
    mgr = LeaseManager(await make_kv(conns[0], "leases", ttl=30), "w-a", 30)
    lease = await mgr.try_acquire(KEY)
    assert lease is not None
    renewed = await mgr.renew(lease)
    assert renewed is not None
    assert renewed.revision > lease.revision
    assert renewed.acquired_at == lease.acquired_at
    # The old revision is no longer the current one: it cannot renew or release.
    assert await mgr.renew(lease) is None
    assert await mgr.release(lease) is False
    assert await mgr.holder(KEY) == "w-a"
    assert await mgr.release(renewed) is True
    assert await mgr.holder(KEY) is None


async def test_released_lease_can_be_taken_by_another(conns: tuple[Client, Client]) -> None:
    kv = await make_kv(conns[0], "leases", ttl=30)
    a, b = LeaseManager(kv, "w-a", 30), LeaseManager(kv, "w-b", 30)
    lease = await a.try_acquire(KEY)
    assert lease is not None
    assert await b.try_acquire(KEY) is None
    assert await a.release(lease)
    taken = await b.try_acquire(KEY)  # over the delete marker
    assert taken is not None
    assert taken.owner == "w-b"
    assert await a.holder(KEY) == "w-b"


async def test_expiry_lets_another_acquire_and_fences_the_stale_holder(conns: tuple[Client, Client]) -> None:
    kv_a = await make_kv(conns[0], "leases", ttl=2)
    kv_b = await conns[1].jetstream().key_value("leases")
    a, b = LeaseManager(kv_a, "w-a", 2), LeaseManager(kv_b, "w-b", 2)
    stale = await a.try_acquire(KEY)
    assert stale is not None
    assert await b.try_acquire(KEY) is None

    taken: list[Lease] = []

    async def b_took_it() -> bool:
        lease = await b.try_acquire(KEY)
        if lease is not None:
            taken.append(lease)
        return lease is not None

    await eventually(b_took_it)
    assert await a.holder(KEY) == "w-b"
    # The stale holder can neither extend nor delete the new owner's lease.
    assert await a.renew(stale) is None
    assert await a.release(stale) is False
    assert await b.holder(KEY) == "w-b"
    assert await b.renew(taken[0]) is not None


async def test_expired_key_with_limit_marker_can_be_acquired(conns: tuple[Client, Client]) -> None:
    # With limit markers an expired key leaves an empty marker that a plain create() refuses (nats-facts).
    kv = await make_kv(conns[0], "leases", ttl=2, marker_ttl=60)
    a, b = LeaseManager(kv, "w-a", 2), LeaseManager(kv, "w-b", 2)
    assert await a.try_acquire(KEY) is not None

    async def marker_left() -> bool:
        entry = await kv.get(KEY)
        return not entry.value

    await eventually(marker_left)
    assert await b.holder(KEY) is None
    lease = await b.try_acquire(KEY)
    assert lease is not None
    assert await a.holder(KEY) == "w-b"


async def test_same_owner_takes_its_lease_back_and_old_handle_is_fenced(conns: tuple[Client, Client]) -> None:
    mgr = LeaseManager(await make_kv(conns[0], "leases", ttl=30), "w-a", 30)
    first = await mgr.try_acquire(KEY)
    second = await mgr.try_acquire(KEY)  # e.g. a restart that kept its worker id
    assert first is not None
    assert second is not None
    assert second.revision > first.revision
    assert await mgr.renew(first) is None
    assert await mgr.renew(second) is not None


async def test_holder_and_holders(conns: tuple[Client, Client]) -> None:
    kv = await make_kv(conns[0], "leases", ttl=30)
    a, b = LeaseManager(kv, "w-a", 30), LeaseManager(kv, "w-b", 30)
    assert await a.holder(KEY) is None
    assert await a.holders() == {}
    await a.try_acquire("default.echo.0")
    await b.try_acquire("default.echo.1")
    released = await b.try_acquire("default.echo.2")
    assert released is not None
    await b.release(released)
    await a.try_acquire("other.echo.0")
    assert await a.holders("default.echo.*") == {"default.echo.0": "w-a", "default.echo.1": "w-b"}
    assert (await a.holders())["other.echo.0"] == "w-a"


async def test_manager_rejects_bad_arguments(conns: tuple[Client, Client]) -> None:
    kv = await make_kv(conns[0], "leases", ttl=30)
    with pytest.raises(ValueError, match="owner_id"):
        LeaseManager(kv, "", 30)
    with pytest.raises(ValueError, match="ttl_s"):
        LeaseManager(kv, "w", 0)


# -- LeaseKeeper -----------------------------------------------------------------------------------------
def _key_for(p: int) -> str:
    return f"default.echo.{p}"


async def test_keeper_reports_acquired_and_lost(conns: tuple[Client, Client]) -> None:
    kv = await make_kv(conns[0], "leases", ttl=30)
    acquired: list[int] = []
    lost: list[int] = []

    async def on_lost(p: int) -> None:
        lost.append(p)

    keeper = LeaseKeeper(LeaseManager(kv, "w-a", 30), _key_for, on_acquired=acquired.append, on_lost=on_lost)
    other = LeaseManager(kv, "w-b", 30)
    assert await keeper.acquire(0)
    assert await keeper.acquire(1)
    assert await keeper.acquire(1)  # already held: no second callback
    assert await other.try_acquire(_key_for(2)) is not None
    assert not await keeper.acquire(2)
    assert acquired == [0, 1]
    first = keeper.held[0]

    assert await keeper.renew_all() == []
    assert keeper.held[0].revision > first.revision
    # An operator (or a bug) hands partition 1 to someone else: the keeper must notice and report it.
    await kv.delete(_key_for(1))
    assert await other.try_acquire(_key_for(1)) is not None
    assert await keeper.renew_all() == [1]
    assert lost == [1]
    assert set(keeper.held) == {0}


async def test_keeper_loop_renews_and_calls_on_lost(conns: tuple[Client, Client]) -> None:
    kv = await make_kv(conns[0], "leases", ttl=30)
    lost = asyncio.Event()
    keeper = LeaseKeeper(LeaseManager(kv, "w-a", 30), _key_for, on_lost=lambda p: lost.set(), interval_s=0.05)
    assert await keeper.acquire(3)
    start_rev = keeper.held[3].revision
    keeper.start()
    try:
        # Renewals show up as new revisions of the key; wait for one via a watch instead of sleeping.
        watcher = await kv.watch(_key_for(3))
        while True:
            entry = await watcher.updates(timeout=5)  # type: ignore[no-untyped-call]
            if entry is not None and entry.revision > start_rev:
                break
        await watcher.stop()  # type: ignore[no-untyped-call]
        await kv.delete(_key_for(3))
        await asyncio.wait_for(lost.wait(), 5)
        assert 3 not in keeper.held
    finally:
        await keeper.stop()


async def test_keeper_callback_errors_do_not_stop_it(conns: tuple[Client, Client]) -> None:
    kv = await make_kv(conns[0], "leases", ttl=30)

    def boom(p: int) -> None:
        raise RuntimeError("callback bug")

    keeper = LeaseKeeper(LeaseManager(kv, "w-a", 30), _key_for, on_acquired=boom)
    assert await keeper.acquire(0)
    assert await keeper.acquire(1)
    assert set(keeper.held) == {0, 1}


async def test_keeper_apply_and_stop_release(conns: tuple[Client, Client]) -> None:
    kv = await make_kv(conns[0], "leases", ttl=30)
    mgr = LeaseManager(kv, "w-a", 30)
    keeper = LeaseKeeper(mgr, _key_for)
    await keeper.apply([0, 1, 2], [])
    assert set(keeper.held) == {0, 1, 2}
    await keeper.apply([3], [2])
    assert set(keeper.held) == {0, 1, 3}
    assert await mgr.holder(_key_for(2)) is None
    assert not await keeper.release(7)  # never held
    keeper.start()
    await keeper.stop()
    assert keeper.held == {}
    assert await mgr.holders() == {}


# -- plan_partitions -------------------------------------------------------------------------------------
def test_single_worker_takes_everything() -> None:
    assert plan_partitions(4, "a", ["a"], set(), {}) == ([0, 1, 2, 3], [])
    assert plan_partitions(4, "a", [], set(), {}) == ([0, 1, 2, 3], [])  # my_id always counts as live


def test_extra_partitions_go_to_the_first_workers_in_sorted_order() -> None:
    assert [fair_share(5, w, ["b", "a", "c"]) for w in "abc"] == [2, 2, 1]
    assert plan_partitions(5, "c", ["a", "b", "c"], set(), {}) == ([0], [])


def test_surplus_is_released_highest_first() -> None:
    assert plan_partitions(4, "a", ["a", "b"], {0, 1, 2, 3}, {}) == ([], [3, 2])


def test_partitions_held_by_others_are_not_acquired() -> None:
    to_acquire, to_release = plan_partitions(4, "b", ["a", "b"], set(), {0: "a", 1: "a", 2: "dead"})
    assert (to_acquire, to_release) == ([3], [])


def test_partitions_beyond_the_count_are_released() -> None:
    assert plan_partitions(2, "a", ["a"], {0, 5}, {}) == ([1], [5])


def test_plan_rejects_zero_partitions() -> None:
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        plan_partitions(0, "a", ["a"], set(), {})


def _converge(partitions: int, owners: dict[int, str], workers: list[str], rng: random.Random) -> None:
    """Let every worker run plan_partitions in random order until nothing changes (acquire is atomic)."""
    for _ in range(10):
        changed = False
        for me in rng.sample(workers, len(workers)):
            owned = {p for p, w in owners.items() if w == me}
            others = {p: w for p, w in owners.items() if w != me}
            to_acquire, to_release = plan_partitions(partitions, me, workers, owned, others)
            for p in to_release:
                del owners[p]
            for p in to_acquire:
                assert p not in owners, "a plan tried to take a held partition"
                owners[p] = me
            changed = changed or bool(to_acquire or to_release)
        if not changed:
            return
    raise AssertionError("no fixed point after 10 rounds")


def _assert_balanced(partitions: int, owners: dict[int, str], workers: list[str]) -> None:
    assert sorted(owners) == list(range(partitions))
    assert set(owners.values()) <= set(workers)
    loads = [sum(1 for w in owners.values() if w == me) for me in workers]
    assert sum(loads) == partitions
    assert max(loads) - min(loads) <= 1
    assert loads == [fair_share(partitions, me, workers) for me in workers]


@settings(max_examples=200, deadline=None)
@given(
    partitions=st.integers(1, 40),
    n_workers=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
    initial=st.lists(st.integers(-1, 7), max_size=40),
)
def test_fair_share_converges_to_one_owner_each_and_balanced_loads(
    partitions: int, n_workers: int, seed: int, initial: list[int]
) -> None:
    rng = random.Random(seed)
    workers = [f"w{i}" for i in range(n_workers)]
    # Any starting state: some partitions already held (a previous round, a restart), the rest free.
    owners = {p: workers[w % n_workers] for p, w in enumerate(initial[:partitions]) if w >= 0}
    _converge(partitions, owners, workers, rng)
    _assert_balanced(partitions, owners, workers)

    # A worker dies (its leases expire) and a new one joins: the cluster converges again.
    if n_workers > 1:
        dead = rng.choice(workers)
        workers = [w for w in workers if w != dead] + ["w-new"]
        owners = {p: w for p, w in owners.items() if w != dead}
        _converge(partitions, owners, workers, rng)
        _assert_balanced(partitions, owners, workers)


@given(
    partitions=st.integers(1, 200), workers=st.sets(st.text(min_size=1, max_size=5), min_size=1, max_size=20)
)
def test_shares_sum_exactly_to_the_partition_count(partitions: int, workers: set[str]) -> None:
    shares = [fair_share(partitions, w, workers) for w in workers]
    assert sum(shares) == partitions
    assert max(shares) - min(shares) <= 1
    assert max(shares) == -(-partitions // len(workers))


async def test_recover_adopts_only_this_holders_own_newer_write(conns: tuple[Client, Client]) -> None:
    """A renewal whose reply was lost may have been applied: `recover` keeps the lease when the stored
    record is still this acquisition's, and refuses when someone else (or a new acquisition) wrote."""
    kv = await make_kv(conns[0], "leases", ttl=30)
    mgr = LeaseManager(kv, "w-a", 30)
    lease = await mgr.try_acquire(KEY)
    assert lease is not None
    applied = await mgr.renew(lease)  # stands for the renewal whose answer never arrived
    assert applied is not None
    assert await mgr.renew(lease) is None  # the stale handle alone stays fenced
    recovered = await mgr.recover(lease)
    assert recovered is not None
    assert recovered.revision > applied.revision
    assert await mgr.renew(recovered) is not None
    # A new acquisition by the same owner (a restart with the same id) is not the old lease's.
    again = await mgr.try_acquire(KEY)
    assert again is not None
    assert await mgr.recover(lease) is None
    # Another owner's record is never adopted.
    other = LeaseManager(await conns[1].jetstream().key_value("leases"), "w-b", 30)
    assert await mgr.release(again) is True
    taken = await other.try_acquire(KEY)
    assert taken is not None
    assert await mgr.recover(lease) is None
    assert await mgr.holder(KEY) == "w-b"
