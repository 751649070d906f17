"""Time travel: a run tree exported to one file (`Runtime.export_run`, ``plexus runs export``) and replayed
offline against an app's agent code (see docs/timetravel.md).

The recording's wire types and reader are here for other tools (fork, transcript views) to import.
"""

from plexus.runtime.client._export import RunNotEndedError
from plexus.runtime.timetravel._errors import ReplayAppMismatchError, ReplayDivergedError
from plexus.runtime.timetravel._hooks import ReplayHook, register_replay_hook
from plexus.runtime.timetravel._log import ReplayLog
from plexus.runtime.timetravel._replay import Divergence, ReplayReport, assert_replays, replay, replay_file
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
    "Divergence",
    "InputLine",
    "LogLine",
    "ProgressLine",
    "Recording",
    "RecordingError",
    "RecordingFormatError",
    "RecordingHeader",
    "RecordingVersionError",
    "ReplayAppMismatchError",
    "ReplayDivergedError",
    "ReplayHook",
    "ReplayLog",
    "ReplayReport",
    "RunLine",
    "RunNotEndedError",
    "StateLine",
    "assert_replays",
    "read_recording",
    "recording_lines",
    "register_replay_hook",
    "replay",
    "replay_file",
]
