"""The run-tree recording file (``plexus runs export``): its wire types, writer and reader.

JSON Lines. The first line is a `RecordingHeader` (format name, version, source namespace, root run id,
export time); every other line is one object with a ``kind``: a run record, the root run's input, an entry
of an agent's EventLog (its own log, ``log == ""``, or a sibling log such as ``<type>.llm-journal``, named by
its type suffix), an agent's state before the tree's first message to it, or a progress event. Entries and
records are kept as the raw JSON the cluster stored, so a reader of a later version loses nothing.

A reader refuses a file of a newer format version (`RecordingVersionError`) and a line it cannot parse
(`RecordingFormatError`, with the line number); kinds it does not know are skipped, so a version may add
kinds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec

from plexus.core import KernelError

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

FORMAT_NAME = "plexus-run-recording"
#: Bumped when a reader of the previous version would misread a file (new optional fields and kinds do not).
FORMAT_VERSION = 1


class RecordingError(KernelError):
    """A recording cannot be made or used: the reason is in the message."""


class RecordingFormatError(RecordingError):
    """A line of a recording is not what the format says (``line``: its 1-based number)."""

    fields: ClassVar[tuple[str, ...]] = ("message", "line")

    def __init__(self, message: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.line = line


class RecordingVersionError(RecordingError):
    """The file was written by a newer format version than this reader knows."""

    fields: ClassVar[tuple[str, ...]] = ("message", "version", "supported")

    def __init__(self, message: str = "", version: int = 0, supported: int = FORMAT_VERSION) -> None:
        super().__init__(message)
        self.version = version
        self.supported = supported


class RecordingHeader(msgspec.Struct, kw_only=True):
    """The first line: what the file is and where it came from."""

    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    namespace: str
    root_run_id: str
    exported_at: float = msgspec.field(default_factory=time.time)
    #: True when the tree had not ended when it was exported: later steps are missing.
    partial: bool = False


class RunLine(msgspec.Struct, kw_only=True, tag_field="kind", tag="run"):
    """One run of the tree: its `RunRecord` as the orchestrator stored it."""

    record: msgspec.Raw


class InputLine(msgspec.Struct, kw_only=True, tag_field="kind", tag="input"):
    """The root run's input: the JSON array of content blocks it was started with."""

    run_id: str
    blocks: msgspec.Raw


class LogLine(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="kind", tag="log"):
    """One entry of an EventLog. ``log``: "" for the agent's own log, else the sibling's type suffix."""

    agent_id: str
    seq: int
    index: int
    entry: msgspec.Raw
    log: str = ""


class StateLine(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="kind", tag="state"):
    """An agent's state before the tree's first message to it (None with ``known=False``: not in the log)."""

    agent_id: str
    state: dict[str, Any] | None = None
    known: bool = True


class ProgressLine(msgspec.Struct, kw_only=True, tag_field="kind", tag="progress"):
    """One `AgentProgress` event of the tree, as published."""

    event: msgspec.Raw


Line = RunLine | InputLine | LogLine | StateLine | ProgressLine

_LINE = msgspec.json.Decoder(Line)
_KIND = msgspec.json.Decoder(dict[str, Any])
_HEADER = msgspec.json.Decoder(RecordingHeader)
_ENCODER = msgspec.json.Encoder()


@dataclass
class Recording:
    """A parsed recording: the header and its lines by kind (each list in file order)."""

    header: RecordingHeader
    runs: list[RunLine] = field(default_factory=list)
    inputs: list[InputLine] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    states: list[StateLine] = field(default_factory=list)
    progress: list[ProgressLine] = field(default_factory=list)

    def add(self, line: Line) -> None:
        match line:
            case RunLine():
                self.runs.append(line)
            case InputLine():
                self.inputs.append(line)
            case LogLine():
                self.logs.append(line)
            case StateLine():
                self.states.append(line)
            case ProgressLine():
                self.progress.append(line)

    def lines(self) -> Iterator[Line]:
        yield from self.runs
        yield from self.inputs
        yield from self.states
        yield from self.logs
        yield from self.progress


def recording_lines(recording: Recording) -> Iterator[bytes]:
    """The file's lines, each ending with a newline: the header first."""
    yield _ENCODER.encode(recording.header) + b"\n"
    for line in recording.lines():
        yield _ENCODER.encode(line) + b"\n"


def read_recording(lines: Iterable[bytes | str]) -> Recording:
    """Parse a recording's lines (e.g. an open file).

    Raises `RecordingFormatError` or `RecordingVersionError`."""
    recording: Recording | None = None
    for number, raw in enumerate(lines, start=1):
        data = raw.encode() if isinstance(raw, str) else raw
        if not data.strip():
            continue
        if recording is None:
            recording = Recording(_header(data, number))
            continue
        try:
            recording.add(_LINE.decode(data))
        except msgspec.ValidationError as exc:
            try:
                kind = _KIND.decode(data).get("kind")
            except msgspec.DecodeError:
                kind = None
            if isinstance(kind, str) and kind not in _KINDS:
                continue  # a kind of a later minor revision: skipped, as the format promises
            raise RecordingFormatError(f"line {number}: {exc}", number) from None
        except msgspec.DecodeError as exc:
            raise RecordingFormatError(f"line {number}: not JSON: {exc}", number) from None
    if recording is None:
        raise RecordingFormatError("empty file: no header line", 1)
    return recording


_KINDS = frozenset({"run", "input", "log", "state", "progress"})


def _header(data: bytes, number: int) -> RecordingHeader:
    try:
        fields = _KIND.decode(data)
    except msgspec.DecodeError as exc:
        raise RecordingFormatError(f"line {number}: the header is not JSON: {exc}", number) from None
    if fields.get("format") != FORMAT_NAME:
        raise RecordingFormatError(
            f"line {number}: not a {FORMAT_NAME} file (format {fields.get('format')!r})", number
        )
    version = fields.get("version")
    if not isinstance(version, int) or version < 1:
        raise RecordingFormatError(f"line {number}: bad format version {version!r}", number)
    if version > FORMAT_VERSION:
        raise RecordingVersionError(
            f"the file is format version {version}; this Plexus reads up to {FORMAT_VERSION}: upgrade it",
            version,
        )
    try:
        return _HEADER.decode(data)
    except msgspec.ValidationError as exc:
        raise RecordingFormatError(f"line {number}: bad header: {exc}", number) from None


#: The literal type of `Line`'s tags, for callers that dispatch on them.
LineKind = Literal["run", "input", "log", "state", "progress"]
