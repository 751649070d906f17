"""The inputs the fuzzer found, kept as exact reproducers (`test_found_inputs.py` replays them all).

Each was found by `python -m tests.fuzz --keep-going` against the tree before issue 9's fixes (commit
1e6e052): seeds 20261124 (3,000 messages) and 7 (2,000 messages), then cut down to one input per defect.
Above each input: the defect of issue 9 it reproduces and the check of the harness that failed there
(`python -m tests.fuzz --found --keep-going` in a checkout of that commit, with tests/fuzz copied in).
"""

from __future__ import annotations

import time

import msgspec

from plexus.core import MessageId, RunId, TextBlock
from plexus.runtime.wire._envelope import Envelope, RunInfo, encode_envelope, payload_from_blocks
from plexus.runtime.wire._orchestration import CancelNotice, FinishedReport, StartRunRequest
from plexus.runtime.wire._subjects import Subjects

from .mutate import VICTIM, Shot


def _env(target: str, reply_to: str | None, run: RunInfo | None = None) -> tuple[str, bytes]:
    msg_id = str(MessageId.new())
    env = Envelope(
        id=msg_id,
        kind="send",
        target=target,
        reply_to=reply_to,
        payload=payload_from_blocks([TextBlock(text="hi")]),
        run=run,
        sent_at=time.time(),
    )
    return msg_id, encode_envelope(env)


def _headers(msg_id: str, **extra: str) -> dict[str, str]:
    return {"Nats-Msg-Id": msg_id, "Plexus-V": "1", **extra}


def found_inputs(subjects: Subjects, inbox: str) -> list[Shot]:
    """The reproducers, built fresh (new message ids) for one run; `inbox` is the sender's reply prefix."""
    shots: list[Shot] = []

    def inbox_shot(
        key: str, data: bytes, headers: dict[str, str] | None, note: str, pause: float = 0
    ) -> None:
        subject = subjects.inbox("echo", key)
        shots.append(Shot("inbox", subject, data, headers, jetstream=True, notes=[note], pause_after=pause))

    # Valid first messages, so the victims of items 7 and "junk" below are active with a checkpoint.
    for key in (VICTIM, "f6"):
        msg_id, data = _env(f"echo/{key}", inbox + ".ok")
        inbox_shot(key, data, _headers(msg_id), "warm-up", pause=0.5 if key == "f6" else 0.0)

    # Item 1. Failed: "the worker's connection is gone" (connz lists no "plexus"), then every liveness round
    # timed out; nats-py had closed the worker's connection on "maximum control line exceeded".
    msg_id, data = _env("echo/f0", "_INBOX." + "y" * 5000)
    inbox_shot("f0", data, _headers(msg_id), "item 1: 5,000-char reply_to")

    # Item 2. Failed: "a traceback in the worker log" (RecursionError / UnicodeDecodeError / ValueError out
    # of the dispatcher), then "messages never acked" (redelivered forever, each leaking a slot).
    msg_id, data = _env("echo/f2", inbox + ".n")
    nested = data.replace(b'"payload":', b'"payload":[' + b"[" * 5000 + b"]" * 5000 + b'],"_p":', 1)
    inbox_shot("f2", nested, _headers(msg_id), "item 2: payload nested 5,000 deep")
    msg_id, data = _env("echo/f2", inbox + ".u")
    inbox_shot("f2", data.replace(b'"hi"', b'"\xff\xfehi"'), _headers(msg_id), "item 2: invalid UTF-8")
    msg_id, data = _env("echo/f2", inbox + ".v")
    inbox_shot("f2", data, _headers(msg_id, **{"Plexus-V": "1" * 5000}), "item 2: Plexus-V of 5,000 digits")
    msg_id, data = _env("echo/f2", inbox + ".w")
    big_v = data.replace(b'"v":1', b'"v":' + b"9" * 5000, 1)
    inbox_shot("f2", big_v, _headers(msg_id), "item 2: v of 5,000 digits")
    # The same on the stateless path: the caller timed out instead of getting a ProtocolError.
    msg_id, data = _env("echo-eph/f2", inbox + ".e")
    shots.append(
        Shot(
            "eph",
            subjects.ephemeral("echo-eph", "f2"),
            data.replace(b'"hi"', b'"\xc3\x28hi"'),
            _headers(msg_id),
            reply=True,
            notes=["item 2: invalid UTF-8, stateless"],
        )
    )
    # Failed: "orchestrator answered 500" (HandlerError: RecursionError / UnicodeDecodeError).
    for verb, body in [
        ("start", b'{"v":1,"x":' + b"[" * 3000 + b"]" * 3000 + b"}"),
        ("cancel", b'{"run_id":"\xff\xferun_x"}'),
        ("get", b'{"run_id":"\xed\xa0\x80"}'),
    ]:
        shots.append(
            Shot("orch", f"{subjects.base}.orch.{verb}", body, reply=True, notes=[f"item 2: {verb}"])
        )

    # Item 3. Failed: "messages never acked": a forged orchestrated run is handled, its run-end report
    # refused ("unknown run"), and the message redelivered forever (the reply arrives again each time).
    forged = str(RunId.new())
    msg_id, data = _env("echo/f3", inbox + ".f", RunInfo(run_id=forged, root_id=forged, orchestrated=True))
    inbox_shot("f3", data, _headers(msg_id), "item 3: forged orchestrated run")

    # Item 4. Failed: "messages never acked": nats-py's fetch took the delivery for a status line.
    msg_id, data = _env("echo/f4", inbox + ".s")
    inbox_shot("f4", data, _headers(msg_id, Status="404", Description="x"), "item 4: Status: 404 header")

    # Item 5. Failed: "a traceback in the worker log" (ValueError: an error on the wire needs a non-empty
    # 'error_type'). The `finished` report below was answered 404 (unknown run) even then: the 500 needs a
    # run the orchestrator knows (tests/orchestrator covers that); here it checks the answer stays typed.
    root = str(RunId.new())
    notice = CancelNotice(root_id=root, run_id=root, reason="fuzz", error={"error_type": ""})
    shots.append(
        Shot("ctl", subjects.control("cancel", root), msgspec.json.encode(notice), notes=["item 5: cancel"])
    )
    report = FinishedReport(
        run_id=str(RunId.new()),
        status="failed",
        error={"error_type": "BudgetExhaustedError", "fields": {"dimension": 5}},
    )
    shots.append(
        Shot(
            "orch",
            f"{subjects.base}.orch.finished",
            msgspec.json.encode(report),
            reply=True,
            notes=["item 5: finished with an unbuildable error"],
        )
    )

    # Item 6. Failed: "orchestrator answered 500" (SubjectTooLongError at dispatch; the run stayed PENDING
    # and the sweeper logged a traceback every 2 s).
    start = StartRunRequest(
        agent_id="echo/" + "k" * 4000, payload=payload_from_blocks([TextBlock(text="go")])
    )
    shots.append(
        Shot(
            "orch",
            f"{subjects.base}.orch.start",
            msgspec.json.encode(start),
            reply=True,
            notes=["item 6: 4,000-char agent key"],
        )
    )

    # Item 7. Failed: "the EventLog of echo/f1 no longer reads: ValueError('EventLog px.default.evlog.echo.f1
    # seq 13 is not a JSON array: Expected `array`, got `object`')": the worker wrote its reply into the
    # victim's log (the active victim was also fenced once: "EventLog moved: expected last seq 10, found 13").
    msg_id, data = _env("echo/f5", subjects.evlog("echo", VICTIM))
    inbox_shot("f5", data, _headers(msg_id), "item 7: reply_to another agent's EventLog")

    # Not in issue 9's list: came with f9ac858's redelivery dedupe, fixed in 9b50638. Failed at 5e4bd25:
    # "fuzzed agent echo/f6 no longer answers: HandlerError(cause='1 validation error for EventLogEntry ...
    # invalid unicode code point')": after junk written straight onto its EventLog subject the agent's next
    # commit was fenced, and the reload's read of "entries logged after the checkpoint" raised every time.
    # Still open on the current tree (2026-11-24): the fenced message is left unacked without a nak, so the
    # final check fails with "per-key order broken on echo/f6: ... handled ['B', 'C', 'A']"
    # (tests/fuzz/repro_fenced_order.py is the minimal reproducer).
    shots.append(
        Shot(
            "evlog",
            subjects.evlog("echo", "f6"),
            b'[{"type":"\xc3(reply"}]',
            jetstream=True,
            notes=["junk EventLog entry"],
        )
    )
    return shots
