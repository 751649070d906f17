"""tests/e2e/test_orchestrated_runs.py, collected again on the R3 cluster of this directory's conftest."""

from tests.e2e.test_orchestrated_runs import *  # noqa: F403
