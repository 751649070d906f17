"""Plexus gateway: the kernel's HTTP + SSE interface (``/v1``), sessions, and the live run-tree dashboard.

Public API (everything else is private and may change):

- `create_app(runtime, config)`: the FastAPI application over a connected `plexus.runtime.Runtime`
- `GatewayConfig`: bearer tokens (hashed), request size limit, heartbeat period, dev mode
- `Gateway`: uvicorn serving `create_app`, started and stopped from asyncio (the CLI and tests use it)
- `SessionStore`: sessions, transcripts and memory in the ``plexus_sessions`` KV bucket
- `hash_token`: how a bearer token is stored at rest

Any number of replicas may serve one cluster: every piece of state lives in NATS (JetStream KV and streams).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._config import GatewayConfig, hash_token
from ._sessions import SessionStore

if TYPE_CHECKING:
    from ._app import create_app
    from ._server import Gateway

__all__ = ["Gateway", "GatewayConfig", "SessionStore", "create_app", "hash_token"]


def __getattr__(name: str) -> Any:
    # The web stack (FastAPI, uvicorn, sse-starlette: ≈ 0.45 s to import) loads on first use: every
    # `plexus` command imports this package to register its subcommands; a worker or `plexus runs ls`
    # never serves.
    if name == "create_app":
        from ._app import create_app

        return create_app
    if name == "Gateway":
        from ._server import Gateway

        return Gateway
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
