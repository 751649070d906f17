"""The short, seeded version of `make fuzz` that runs inside `make test` (issue 9): a fixed seed, and one
random seed printed so a failure can be replayed with `python -m tests.fuzz --seed <seed>`."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from .harness import fuzz

FIXED_SEED = 20261124
SHORT = 1_500


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [FIXED_SEED, random.randrange(1 << 32)], ids=["fixed", "random"])
async def test_fuzzed_messages_never_disable_the_worker_or_the_orchestrator(
    seed: int, tmp_path: Path
) -> None:
    print(f"fuzz seed {seed} (replay: python -m tests.fuzz --seed {seed} --messages {SHORT})")
    report = await fuzz(seed, SHORT, tmp_path)
    print(report.summary())
    assert report.liveness_rounds >= SHORT // 500
    assert sum(report.kinds.values()) == SHORT
