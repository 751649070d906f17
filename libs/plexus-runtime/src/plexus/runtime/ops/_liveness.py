"""How a Plexus process notices that its NATS server went silent.

A server whose host died or dropped off the network sends no TCP reset: the connection just goes quiet, and
writes pile up in the kernel. nats-py notices only by its pings (by default one every 120 s, two left
unanswered), so a process kept sending into the void for minutes. Every Plexus connection pings every
`PING_INTERVAL_S` instead and gives the server up for another of its seed list after `MAX_OUTSTANDING_PINGS`
unanswered (nats-py counts one more at the next interval: 2-3 intervals). A PING is a few bytes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_OUTSTANDING_PINGS", "PING_INTERVAL_S", "liveness_options"]

PING_INTERVAL_S = 5.0
MAX_OUTSTANDING_PINGS = 2


def liveness_options(ping_interval_s: float = PING_INTERVAL_S) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect``: the ping schedule above (ValueError unless positive)."""
    if not ping_interval_s > 0:
        raise ValueError(f"ping_interval_s must be positive, got {ping_interval_s}")
    return {"ping_interval": ping_interval_s, "max_outstanding_pings": MAX_OUTSTANDING_PINGS}
