"""The host of the NATS node a client is connected to drops off the network (a dead machine, a pulled cable:
no TCP reset, only silence). The client must notice and fail over to the other nodes within seconds. nats-py
notices a silent server only by its pings, every 120 s by default with 2 unanswered allowed: the client sent
into the void for minutes. `Runtime.connect` pings every 5 s (`ping_interval_s`).

Every process runs on its own host (a network namespace on one bridge: `deploy.local.netns`), so this needs
root; the invariants are those of `make chaos` (`tests/chaos/checker.py`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from deploy.local.netns import Network, netns_available

from plexus.runtime import Runtime
from tests.chaos.checker import check
from tests.chaos.faults import Fault, Fleet
from tests.chaos.harness import Load, _send_numbers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(netns_available() is not None, reason=str(netns_available())),
]

CUT_S = 45.0


@pytest.mark.timeout(300)
async def test_a_client_fails_over_when_its_nats_node_s_host_goes_silent(tmp_path: Path) -> None:
    # One worker and no orchestrator (no run trees here): light enough to run beside the rest of the suite.
    fleet = Fleet(tmp_path, workers=1, orchestrators=0, network=Network("pxl", "10.77.5.0/24"))
    load = Load()
    try:
        fleet.start()
        admin = await Runtime.connect(fleet.cluster.urls, replicas=3)
        client = await Runtime.connect(fleet.cluster.urls)
        try:
            connected = client.nc.connected_url
            assert connected is not None
            node = next(
                j
                for j, server in enumerate(fleet.cluster.servers)
                if server.url.endswith(f"{connected.hostname}:{connected.port}")
            )
            stop_at = time.monotonic() + 20.0 + CUT_S
            # Deadlines longer than the cut: a message that waited out a 30 s one would never be answered.
            senders = [
                asyncio.create_task(_send_numbers(client, f"k{i}", stop_at, load, timeout=120))
                for i in range(4)
            ]
            await asyncio.sleep(10.0)
            host = fleet.hosts[f"n{node}"]
            fault = Fault("cut_host", f"n{node}", time.time())
            host.cut()
            try:
                await asyncio.sleep(CUT_S)
            finally:
                host.heal()
            fault.healed_at = time.time()
            await asyncio.gather(*senders)
            report = await check(client, admin, tmp_path, load, [fault], 0, 20.0 + CUT_S)
            failed_over_to = client.nc.connected_url
        finally:
            await client.close()
            await admin.close()
    finally:
        fleet.stop()
    print(f"client on node {node}, now on {failed_over_to}; {report.summary()}")
    assert report.details == []
    assert report.ok, report.violations
    assert report.unanswered == 0
    assert failed_over_to is not None
    assert failed_over_to.netloc != connected.netloc
    # Every key answered again well before the link came back (only the heal ended the wait before: 53.7 s).
    assert report.recovery_s["cut_host"][0] < CUT_S - 5.0, report.recovery_s
