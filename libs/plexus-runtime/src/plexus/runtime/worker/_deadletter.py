"""Dead-lettering: a copy of an unhandleable message goes to `PLEXUS_DLQ` with why, and from where."""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from plexus.runtime.ops._telemetry import INSTRUMENTS, metrics_enabled
from plexus.runtime.store._artifacts import headers_size
from plexus.runtime.store._connection import Connection
from plexus.runtime.wire._envelope import Envelope
from plexus.runtime.wire._subjects import Subjects

__all__ = ["dead_letter"]

log = logging.getLogger("plexus.worker")


def _header_value(text: str, limit: int = 1000) -> str:
    """`text` made safe for a NATS header: a CR or LF (exception texts, attacker-chosen ids) would end the
    header block early and corrupt the copy."""
    return " ".join(str(text)[:limit].splitlines())


async def dead_letter(
    connection: Connection,
    subjects: Subjects,
    worker_id: str,
    msg: Msg,
    reason: str,
    detail: str,
    env: Envelope | None,
) -> bool:
    """Publish `msg` to ``<prefix>.<ns>.dlq.<type>`` with ``Plexus-Dlq-*`` headers; False if that failed."""
    # A target is `[ns/]type/key` and only the key may hold '/': split twice, the type precedes the key.
    parts = env.target.split("/", 2) if env is not None else []
    try:
        dlq_subject = subjects.dlq(parts[-2] if len(parts) >= 2 else "_invalid")
    except ValueError:  # a type too long for a subject: it must still be dead-lettered and acked
        dlq_subject = subjects.dlq("_invalid")
    headers = {
        "Plexus-Dlq-Reason": reason,
        "Plexus-Dlq-Detail": _header_value(detail),
        "Plexus-Dlq-Subject": msg.subject,
        "Plexus-Dlq-Worker": worker_id,
        "Plexus-Dlq-Size": str(len(msg.data)),
    }
    if env is not None and env.run is not None:
        headers["Plexus-Dlq-Run"] = _header_value(env.run.run_id)
        headers["Plexus-Dlq-Root"] = _header_value(env.run.root_id)
        headers["Plexus-Dlq-Target"] = _header_value(env.target)
    # Our headers make the copy bigger than the original; past max_payload the server would close the
    # connection (and the message would come back forever), so keep only a prefix of the body.
    room = connection.nc.max_payload - headers_size(headers)
    data = msg.data if len(msg.data) <= room else msg.data[: max(room, 0)]
    try:
        await connection.js.publish(dlq_subject, data, headers=headers)
    except Exception:
        log.exception("dead-lettering failed; leaving the message for redelivery")
        return False
    log.warning("dead-lettered %s: %s (%s)", msg.subject, reason, detail)
    if metrics_enabled():
        INSTRUMENTS.dead_letters.add(1, {"reason": reason})
    return True
