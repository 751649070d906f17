"""What every request handler needs, kept on ``app.state.gw`` (nothing here is state of the cluster: that
lives in NATS; this is only the connection and configuration)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from plexus.runtime import Runtime

from ._config import GatewayConfig
from ._problems import Problem
from ._runs import RunsView
from ._sessions import SessionStore

__all__ = ["GatewayState", "authorize", "state"]


@dataclass
class GatewayState:
    rt: Runtime
    config: GatewayConfig
    runs: RunsView
    sessions: SessionStore | None = None
    # Tasks that write a session's transcript when its run ends; any replica reconciles if this one dies.
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def session_store(self) -> SessionStore:
        if self.sessions is None:
            raise Problem(503, "Service unavailable", "the session store is not open yet")
        return self.sessions


def state(request: Request) -> GatewayState:
    gw: GatewayState = request.app.state.gw
    return gw


_bearer = HTTPBearer(auto_error=False, description="a token configured with `plexus gateway --token-hash`")


async def authorize(request: Request) -> None:
    """Bearer token from the Authorization header, or ``access_token`` in the query (EventSource cannot
    send headers)."""
    gw = state(request)
    if gw.config.dev:
        return
    creds: HTTPAuthorizationCredentials | None = await _bearer(request)
    token = creds.credentials if creds is not None else request.query_params.get("access_token")
    if not gw.config.allows(token):
        raise Problem(401, "Unauthorized", "a valid bearer token is required", headers_www="Bearer")
