"""What every request handler needs, kept on ``app.state.gw`` (nothing here is state of the cluster: that
lives in NATS; this is only the connection and configuration)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from plexus.runtime import Runtime

from ._access import RateLimiter, TokenRegistry
from ._config import GatewayConfig
from ._problems import Problem
from ._runs import RunsView
from ._sessions import SessionStore

__all__ = ["GatewayState", "authorize", "caller_name", "state"]


@dataclass
class GatewayState:
    rt: Runtime
    config: GatewayConfig
    runs: RunsView
    sessions: SessionStore | None = None
    tokens: TokenRegistry | None = None
    limiter: RateLimiter | None = None
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
    send headers): one of ``--token-hash`` or a live token of the tenant's bucket; then the caller's rate."""
    gw = state(request)
    caller: str | None
    if gw.config.dev:
        caller = f"addr:{request.client.host if request.client else '-'}"
    else:
        creds: HTTPAuthorizationCredentials | None = await _bearer(request)
        token = creds.credentials if creds is not None else request.query_params.get("access_token")
        caller = gw.config.static_caller(token)
        if caller is None and token and gw.tokens is not None:
            caller = gw.tokens.identify(token)
        if caller is None:
            raise Problem(401, "Unauthorized", "a valid bearer token is required", headers_www="Bearer")
    request.state.caller_name = _caller_name(gw, caller)
    wait = gw.limiter.take(caller) if gw.limiter is not None and caller is not None else 0.0
    if wait > 0:
        raise Problem(
            429,
            "Too many requests",
            f"more than {gw.config.rate_limit:g} requests per second from this caller",
            headers_retry_after=str(max(1, math.ceil(wait))),
        )


def _caller_name(gw: GatewayState, caller: str | None) -> str | None:
    """Who the caller is, as recorded with what it decides: a named token's name, ``token:<hash prefix>`` for
    a ``--token-hash`` token, the client's address in dev mode."""
    if caller is None or caller.startswith("addr:"):
        return caller
    name = gw.tokens.name_of(caller) if gw.tokens is not None else None
    return f"token:{name}" if name else f"token:{caller[:12]}"


def caller_name(request: Request) -> str | None:
    """The identity `authorize` found for this request (None: none)."""
    name = getattr(request.state, "caller_name", None)
    return name if isinstance(name, str) else None
