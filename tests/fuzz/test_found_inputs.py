"""Every input the fuzzer found (tests/fuzz/found.py, one per defect, each commented with the check it
failed before issue 9's fixes) sent at a real worker and orchestrator: every check of a fuzz run passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from .found import found_inputs
from .harness import replay


@pytest.mark.timeout(240)
async def test_the_inputs_the_fuzzer_found_leave_every_service_serving(tmp_path: Path) -> None:
    report = await replay(found_inputs, tmp_path)
    print(report.summary())
    assert sum(report.kinds.values()) == report.messages > 0
    assert report.liveness_rounds == 2  # one when ready, one after the batch
    # Every bad orchestrator request was answered with a typed 4xx error (none unanswered, none 500).
    assert sum(report.orchestrator_codes.values()) == report.kinds["orch"] > 0
    assert all(code.startswith("4") for code in report.orchestrator_codes)
