"""Fixtures for the LLM loop tests: the runtime suite's Runtime and worker fixtures, reused as they are."""

from __future__ import annotations

from tests.runtime.conftest import runtime, start_worker, worker_process

__all__ = ["runtime", "start_worker", "worker_process"]
