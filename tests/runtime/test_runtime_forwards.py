"""`Runtime` offers every call of the runs and schedules clients it holds, as they are written (issue 42:
they were mixed in; now they are forwarded, and a method added to a held client must be offered too)."""

from __future__ import annotations

import inspect

import pytest

from plexus.runtime import Runtime
from plexus.runtime.client._client_runs import RunsClient
from plexus.runtime.client._client_schedules import SchedulesClient


def _public_methods(cls: type) -> list[str]:
    return [
        name for name, member in vars(cls).items() if inspect.isfunction(member) and not name.startswith("_")
    ]


@pytest.mark.parametrize("held", [RunsClient, SchedulesClient])
def test_runtime_offers_each_method_of_its_held_clients_with_its_signature(held: type) -> None:
    methods = _public_methods(held)
    assert "start_run" in methods or "schedule_run" in methods
    for name in methods:
        offered = getattr(Runtime, name, None)
        assert offered is not None, f"Runtime.{name} is missing"
        assert inspect.signature(offered) == inspect.signature(getattr(held, name)), name
        assert inspect.getdoc(offered), f"Runtime.{name} has no docstring"
