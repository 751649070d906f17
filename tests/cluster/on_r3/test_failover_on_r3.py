"""The core of tests/runtime/test_failover.py on the R3 cluster of this directory's conftest: a worker
killed mid-handler loses nothing and keeps per-key order; a stopped worker hands its partitions over. (The
whole failover suite runs on one node; node loss on R3 is tests/cluster/test_r3_cluster.py and make chaos.)"""

from tests.runtime.test_failover import (
    test_sigkill_mid_handler_loses_nothing_and_keeps_per_key_order,
    test_sigterm_finishes_in_flight_work_and_hands_over,
)

__all__ = [
    "test_sigkill_mid_handler_loses_nothing_and_keeps_per_key_order",
    "test_sigterm_finishes_in_flight_work_and_hands_over",
]
