"""Time travel: a run tree exported to one file (`Runtime.export_run`, ``plexus runs export``) and replayed
offline against an app's agent code (see docs/timetravel.md).

The recording's wire types and reader are here for other tools (fork, transcript views) to import.
"""

from plexus.runtime.wire._recording import (
    FORMAT_NAME,
    FORMAT_VERSION,
    InputLine,
    LogLine,
    ProgressLine,
    Recording,
    RecordingError,
    RecordingFormatError,
    RecordingHeader,
    RecordingVersionError,
    RunLine,
    StateLine,
    read_recording,
    recording_lines,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "InputLine",
    "LogLine",
    "ProgressLine",
    "Recording",
    "RecordingError",
    "RecordingFormatError",
    "RecordingHeader",
    "RecordingVersionError",
    "RunLine",
    "StateLine",
    "read_recording",
    "recording_lines",
]
