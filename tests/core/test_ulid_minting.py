"""Ids are minted by a C generator (ulid-transform); they must stay valid ULIDs, sort by time, and never
repeat across a fork (the generator's state would be copied into the child)."""

from __future__ import annotations

import os
import sys

import pytest
from ulid import ULID

from plexus.core import ReplyMessage, RunId


def test_minted_ids_are_ulids_of_their_timestamp() -> None:
    entries = [ReplyMessage(text="x", timestamp=1_700_000_000.5 + i) for i in range(50)]
    for entry in entries:
        parsed = ULID.from_str(entry.id)
        assert str(parsed) == entry.id
        assert parsed.milliseconds == round(entry.timestamp * 1000)
    assert [e.id for e in entries] == sorted(e.id for e in entries)  # later timestamps sort later
    run = RunId.new()
    assert run.ulid is not None
    assert run == f"run_{run.ulid}"


def test_ids_are_unique() -> None:
    ids = {ReplyMessage(text="x", timestamp=1_700_000_000.0).id for _ in range(20_000)}
    assert len(ids) == 20_000  # one millisecond, 20k ids: the randomness tells them apart
    assert len({RunId.new() for _ in range(20_000)}) == 20_000


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork")
def test_a_forked_child_never_mints_its_parents_ids() -> None:
    """Same timestamp on both sides of a fork: without the child's own randomness the two sequences
    would be identical (JetStream would then drop a message as a duplicate of another)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: mint, report, exit without running the parent's teardown
        try:
            minted = [ReplyMessage(text="x", timestamp=1_700_000_000.0).id for _ in range(50)]
            os.write(write_end, "\n".join(minted).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    parent = [ReplyMessage(text="x", timestamp=1_700_000_000.0).id for _ in range(50)]
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    child = b"".join(chunks).decode().split("\n")
    assert len(child) == 50
    assert not set(parent) & set(child)
