"""argparse value types shared by the `plexus` commands, so a bad value is one line, never a traceback.

A value argparse accepts unchecked fails later, far from the flag: a port above 65535 as an `OverflowError`
from `bind()`, an empty agent key as a pydantic dump of several lines, a lease TTL of 0 as a `ValueError`
from the topology.
"""

from __future__ import annotations

import argparse
import math

from pydantic import ValidationError

from plexus.core import AgentId

__all__ = [
    "agent_id_argument",
    "nats_url",
    "non_negative_int",
    "non_negative_number",
    "port_number",
    "positive_int",
    "positive_seconds",
]


def port_number(value: str) -> int:
    """A TCP port, 0-65535 (0: the system picks a free one)."""
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (0-65535), got {value!r}")
    return int(value)


def _number(value: str, kind: type[int] | type[float], what: str) -> float:
    try:
        number = kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
    return number


def positive_int(value: str) -> int:
    number = int(_number(value, int, "a whole number"))
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def non_negative_int(value: str) -> int:
    number = int(_number(value, int, "a whole number"))
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {number}")
    return number


def positive_seconds(value: str) -> float:
    number = _number(value, float, "a number of seconds")
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {value}")
    return number


def non_negative_number(value: str) -> float:
    number = _number(value, float, "a number")
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return number


def nats_url(value: str) -> str:
    if not value.startswith(("nats://", "tls://", "ws://", "wss://")):
        raise argparse.ArgumentTypeError(f"expected a nats:// URL, got {value!r}")
    return value


def agent_id_argument(value: str) -> AgentId:
    """``[namespace/]type/key``; what is wrong with it in one line (pydantic's own text is several)."""
    try:
        return AgentId.parse(value)
    except ValidationError as exc:
        why = "; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())
        raise argparse.ArgumentTypeError(f"expected an agent id TYPE/KEY, got {value!r}: {why}") from None
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"expected an agent id TYPE/KEY, got {value!r}: {exc}") from None
