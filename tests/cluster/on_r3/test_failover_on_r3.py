"""tests/runtime/test_failover.py, collected again on the R3 cluster of this directory's conftest."""

from tests.runtime.test_failover import *  # noqa: F403
