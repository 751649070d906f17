"""Schemathesis against the live gateway's /openapi.json: no generated input may yield a 5xx or a body that
contradicts the documented schema (issue 11 item 2)."""

from __future__ import annotations

import asyncio

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from .conftest import TOKEN, Stack

pytestmark = pytest.mark.timeout(600)

#: The RPC waits up to its (generated) timeout for an agent type nobody hosts, and the runs-changes stream
#: never ends (it has no parameter to fuzz either): both covered by test_runs_api.
SKIPPED = {("POST", "/v1/agents/{agent_type}/{key}/messages"), ("GET", "/v1/runs/changes")}
EXAMPLES = 60


def fuzz(url: str) -> list[str]:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    checked: list[str] = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operation = result.ok()
        if (operation.method.upper(), operation.path) in SKIPPED:
            continue
        strategy = st.one_of(
            operation.as_strategy(),
            operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE),
        )

        @given(case=strategy)
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
        def check(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
            response = case.call(base_url=url, headers=headers, timeout=30)
            case.validate_response(
                response, checks=[not_a_server_error, response_schema_conformance, content_type_conformance]
            )

        check()
        checked.append(f"{operation.method.upper()} {operation.path}")
    return checked


async def test_no_generated_request_yields_a_server_error(gw: Stack) -> None:
    checked = await asyncio.to_thread(fuzz, gw.url)
    assert "POST /v1/runs" in checked
    assert "GET /v1/runs/{run_id}/events" in checked
    assert len(checked) >= 12
