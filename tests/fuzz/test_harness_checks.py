"""The harness's own failure path: a service that dies during a run fails it with the seed, the batch and
the replay command (the pre-fix tree's failures are in docs/fuzzing.md and tests/fuzz/found.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plexus.runtime.kernel import Subjects

from .harness import FuzzFailure, Harness
from .mutate import Shot


@pytest.mark.timeout(120)
async def test_a_worker_that_dies_mid_run_fails_the_run(tmp_path: Path) -> None:
    def kill_worker_then_send(subjects: Subjects, inbox: str) -> list[Shot]:
        harness.procs["worker"].kill()
        return [Shot("topic", subjects.topic("fuzz", "f0"), b"{}")]

    harness = Harness(5, 0, tmp_path, fixed=kill_worker_then_send)
    with pytest.raises(FuzzFailure, match=r"fuzz seed 5, batch 1: worker exited with -9") as failed:
        await harness.run()
    assert "replay: python -m tests.fuzz --seed 5" in str(failed.value)
