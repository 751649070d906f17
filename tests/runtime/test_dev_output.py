"""`plexus dev`'s stdout lets out whole lines only: a service's relayed line never lands inside a line the
user's script is printing in pieces (the quickstart's test saw ``answer: <an orchestrator log line>From the
model: ...`` on a loaded machine)."""

from __future__ import annotations

import asyncio
import io
import sys
import threading

from plexus.runtime.ops._lines import WholeLines, whole_lines


def _interleave(out: io.TextIOBase) -> None:
    """The script's ``print("answer:", "text")`` pieces, with a service's line written between them."""
    halfway = threading.Event()
    relayed = threading.Event()

    def service() -> None:
        halfway.wait(5)
        out.write("plexus orchestrator: run completed\n")
        out.flush()
        relayed.set()

    relay = threading.Thread(target=service)
    relay.start()
    out.write("answer:")
    halfway.set()
    relayed.wait(5)
    out.write(" text")
    out.write("\n")
    relay.join(5)
    out.flush()


def test_a_relayed_line_does_not_land_inside_a_line_printed_in_pieces() -> None:
    plain = io.StringIO()
    _interleave(plain)
    assert plain.getvalue() == "answer:plexus orchestrator: run completed\n text\n"  # what it was

    target = io.StringIO()
    _interleave(WholeLines(target))
    assert target.getvalue().splitlines() == ["plexus orchestrator: run completed", "answer: text"]


def test_a_flush_lets_an_unfinished_line_out_and_each_thread_keeps_its_own() -> None:
    target = io.StringIO()
    out = WholeLines(target)
    out.write("Continue? ")
    assert target.getvalue() == ""
    out.flush()  # a prompt written with end="" and flush=True
    assert target.getvalue() == "Continue? "
    out.write("a\nb")
    assert target.getvalue() == "Continue? a\n"

    def other() -> None:
        out.write("from another thread\n")

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(5)
    out.write("c\n")
    assert target.getvalue() == "Continue? a\nfrom another thread\nbc\n"


async def test_whole_lines_holds_for_the_decorated_coroutine_and_is_undone_after() -> None:
    before = sys.stdout
    seen: list[object] = []

    @whole_lines()
    async def dev() -> None:
        await asyncio.sleep(0)
        seen.append(sys.stdout)

    await dev()
    assert isinstance(seen[0], WholeLines)
    assert sys.stdout is before
