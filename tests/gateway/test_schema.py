"""Schemathesis (its own CLI, every check, every phase) against a live gateway's /openapi.json: what the
document says must be what the server does (issue 11 item 2, issue 36 item 8).

Two runs: one with a fixed seed, one with a random seed that is printed (``PLEXUS_SCHEMA_SEED=N`` replays it).
The coverage phase (each parameter's edges, undeclared methods) does not depend on the seed: only the fixed
run has it. The endless stream of run changes is left out; everything else is fuzzed.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

import pytest

from plexus.gateway import GatewayConfig, hash_token

from .conftest import TOKEN, StartGateway

pytestmark = pytest.mark.timeout(600)

FIXED_SEED = 36_8
#: Examples per operation and phase: some CPU seconds per run (the suite runs on 2 shared cores).
EXAMPLES = 25
#: Which statuses count as refusing invalid data (413 too: the size limit refuses before parsing).
CONFIG = Path(__file__).with_name("schemathesis.toml")
#: Endless streams: they never answer with a complete response (covered by test_runs_api / test_feed).
ENDLESS = ["/v1/runs/changes"]


def _seed(which: str) -> int:
    if which == "fixed":
        return FIXED_SEED
    replay = os.environ.get("PLEXUS_SCHEMA_SEED")
    return int(replay) if replay else random.SystemRandom().randrange(2**32)


# The random run is in test_schema_random.py: its own file, so the two runs go to different test workers.
@pytest.mark.parametrize("which", ["fixed"])
async def test_schemathesis_all_checks_pass(start_gateway: StartGateway, which: str) -> None:
    # No rate limit here: the fuzzer's request rate would otherwise be answered 429, which hides every other
    # check (429 itself is documented on every /v1 operation; test_statuses covers it).
    gw = await start_gateway(
        GatewayConfig(token_hashes=frozenset({hash_token(TOKEN)}), heartbeat_s=1.0, rate_limit=0)
    )
    seed = _seed(which)
    print(f"schemathesis seed {seed} (replay: PLEXUS_SCHEMA_SEED={seed})")
    args = [
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "run",
        f"{gw.url}/openapi.json",
        "--checks",
        "all",
        "--seed",
        str(seed),
        "--phases",
        "examples,coverage,fuzzing,stateful" if which == "fixed" else "examples,fuzzing,stateful",
        "--max-examples",
        str(EXAMPLES),
        "--workers",
        "1",
        "--request-timeout",
        "20",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--suppress-health-check",
        "all",
        "--output-sanitize",
        "true",
        *[arg for path in ENDLESS for arg in ("--exclude-path", path)],
    ]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": ""},
    )
    out, _ = await proc.communicate()
    report = out.decode(errors="replace")
    assert proc.returncode == 0, f"seed {seed} (PLEXUS_SCHEMA_SEED={seed} replays it)\n{report}"
    assert "27 selected / 28 total" in report, report  # every operation but the endless stream
