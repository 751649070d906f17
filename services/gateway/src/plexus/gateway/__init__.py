"""Plexus gateway: the kernel's HTTP + SSE interface (``/v1``), sessions, and the live run-tree dashboard.

Public API (everything else is private and may change):

- `create_app(runtime, config)`: the FastAPI application over a connected `plexus.runtime.Runtime`
- `GatewayConfig`: bearer tokens (hashed), request size limit, heartbeat period, dev mode
- `Gateway`: uvicorn serving `create_app`, started and stopped from asyncio (the CLI and tests use it)
- `SessionStore`: sessions, transcripts and memory in the ``plexus_sessions`` KV bucket
- `hash_token`: how a bearer token is stored at rest

Any number of replicas may serve one cluster: every piece of state lives in NATS (JetStream KV and streams).
"""

from ._app import create_app
from ._config import GatewayConfig, hash_token
from ._server import Gateway
from ._sessions import SessionStore

__all__ = ["Gateway", "GatewayConfig", "SessionStore", "create_app", "hash_token"]
