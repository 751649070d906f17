"""The typed errors of a replay."""

from __future__ import annotations

from plexus.runtime.wire._recording import RecordingError

__all__ = ["ReplayAppMismatchError", "ReplayDivergedError"]


class ReplayAppMismatchError(RecordingError):
    """The app does not register the agent types the recording holds (``missing``), or another namespace."""

    fields = ("message", "missing")

    def __init__(self, message: str = "", missing: list[str] | None = None) -> None:
        super().__init__(message)
        self.missing = list(missing or [])


class ReplayDivergedError(RecordingError):
    """Raised inside a replayed handler that asked for something the recording cannot answer (a child it
    did not spawn, a model turn it did not take): the divergence is reported, the handler is stopped."""
