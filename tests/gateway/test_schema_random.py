"""test_schema.py's run with a random seed (printed; ``PLEXUS_SCHEMA_SEED=N`` replays it), in a file of its
own so that the two schemathesis runs (minutes of CPU each) go to different test workers."""

from __future__ import annotations

import pytest

from .conftest import StartGateway
from .test_schema import test_schemathesis_all_checks_pass as _schemathesis_run

pytestmark = pytest.mark.timeout(600)


async def test_schemathesis_all_checks_pass_with_a_random_seed(start_gateway: StartGateway) -> None:
    await _schemathesis_run(start_gateway, "random")
