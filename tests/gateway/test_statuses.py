"""The dashboard and the run filters know every run status the runtime has: a status the page does not know
as ended (e.g. `guardrail_tripped`) would leave a finished run looking live, with its Cancel button on."""

from __future__ import annotations

import json
import re
from pathlib import Path

from plexus.runtime.orchestration import TERMINAL, RunStatus

STATIC = (
    Path(__file__).resolve().parents[2] / "services" / "gateway" / "src" / "plexus" / "gateway" / "static"
)


def test_the_dashboards_ended_statuses_are_the_runtimes() -> None:
    source = (STATIC / "app.js").read_text()
    found = re.search(r"const TERMINAL = new Set\((\[[^\]]*\])\);", source)
    assert found is not None, "app.js no longer declares TERMINAL as expected"
    assert set(json.loads(found.group(1))) == {str(s) for s in TERMINAL}


def test_the_status_filter_offers_every_status() -> None:
    html = (STATIC / "index.html").read_text()
    offered = set(re.findall(r"<option>([a-z_]+)</option>", html))
    assert {str(s) for s in RunStatus} <= offered
