"""`create_app`: the FastAPI application of the gateway over a connected `Runtime`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from importlib import resources

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from plexus.runtime import Runtime
from plexus.runtime.orchestration import ORCH_SERVICE_NAME

from . import _api_fork, _api_runs, _api_schedules, _api_sessions
from ._a2a_routes import install_a2a
from ._access import RateLimiter, TokenRegistry
from ._config import GatewayConfig
from ._limits import BodyLimit
from ._openapi import install_openapi
from ._problems import install_problem_handlers
from ._runs import RunsView
from ._sessions import SessionStore
from ._state import GatewayState

__all__ = ["create_app"]

STATIC = resources.files("plexus.gateway") / "static"


def create_app(runtime: Runtime, config: GatewayConfig | None = None) -> FastAPI:
    """The gateway's ASGI app. The caller owns ``runtime`` (connects it before, closes it after)."""
    gw = GatewayState(rt=runtime, config=config or GatewayConfig(), runs=RunsView(runtime))
    gw.limiter = RateLimiter(gw.config.rate_limit, gw.config.effective_burst)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        gw.sessions = await SessionStore.open(runtime.js)
        if not gw.config.dev:
            gw.tokens = TokenRegistry(runtime.js)
            await gw.tokens.start()
        try:
            yield
        finally:
            if gw.tokens is not None:
                await gw.tokens.stop()
            for task in list(gw.tasks):
                task.cancel()
            for task in list(gw.tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    app = FastAPI(
        title="Plexus gateway",
        version="1",
        summary="HTTP + SSE interface of a Plexus cluster: agents, runs, run-tree events, sessions.",
        lifespan=lifespan,
    )
    app.state.gw = gw
    install_problem_handlers(app)
    install_openapi(app)
    app.include_router(_api_fork.router)
    app.include_router(_api_runs.router)
    app.include_router(_api_schedules.router)
    app.include_router(_api_sessions.router)
    install_a2a(app, gw)
    app.add_middleware(BodyLimit, max_bytes=gw.config.max_body_bytes)
    if gw.config.cors_origins:  # off unless asked for: no CORS header at all by default
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(gw.config.cors_origins),
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    async def dashboard() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"), media_type="text/html")

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        """Liveness: 503 only once the NATS connection is closed for good (restart the process); a
        reconnect in progress is not a reason to restart."""
        alive = not runtime.nc.is_closed
        return JSONResponse(
            {"ok": alive, "connected": runtime.nc.is_connected}, status_code=200 if alive else 503
        )

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        """Readiness: 200 when NATS is connected and JetStream answers within a second (sessions, runs and
        the event streams need it); the orchestrator's presence is reported, not required."""
        checks = {"nats": runtime.nc.is_connected, "jetstream": False, "orchestrator": False}
        if checks["nats"]:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runtime.js.account_info(), 1.0)
                checks["jetstream"] = True
            with contextlib.suppress(Exception):
                checks["orchestrator"] = bool(
                    await asyncio.wait_for(
                        runtime.nc.request(f"$SRV.PING.{ORCH_SERVICE_NAME}", b"", timeout=1.0), 1.5
                    )
                )
        ready = checks["nats"] and checks["jetstream"]
        return JSONResponse({"ready": ready, **checks}, status_code=200 if ready else 503)

    return app
