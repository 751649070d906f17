"""tests/e2e/test_orchestrated_runs.py, collected here only: on the R3 cluster of this directory's conftest
(the production topology). tests/e2e/conftest.py leaves it out of the single-node run to keep `make test`
within its time budget; `pytest tests/e2e/test_orchestrated_runs.py` still runs it on one node."""

from tests.e2e.test_orchestrated_runs import *  # noqa: F403
