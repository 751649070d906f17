"""``/healthz`` and ``/readyz`` for long-running Plexus processes (workers, orchestrators), for probes.

Liveness is the event loop's: a heartbeat task stamps the time every second, and ``/healthz`` answers
503 once the stamp is older than `stall_s` (a loop blocked by a runaway handler serves nothing; restart
it) or when `alive()` says the process is done for (its NATS connection closed for good). Readiness is
`ready()`: named checks, all of which must hold. The server is the standard library's WSGI server in a
daemon thread, so it answers even while the loop is blocked, which is what a liveness probe is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ._settings import SettingsError

__all__ = ["HealthServer"]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no access log
        return


class HealthServer:
    """Serve ``/healthz`` and ``/readyz`` on `host`:`port` (0 picks a free port: see `port`)."""

    def __init__(
        self,
        ready: Callable[[], dict[str, bool]],
        *,
        alive: Callable[[], bool] = lambda: True,
        host: str = "127.0.0.1",
        port: int = 0,
        stall_s: float = 10.0,
    ) -> None:
        self._ready = ready
        self._alive = alive
        self._host = host
        self._port = port
        self.stall_s = stall_s
        self._beat = time.monotonic()
        self._server: WSGIServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.server_port)

    async def start(self) -> None:
        """Serve on a thread; a port that cannot be had is a `SettingsError` naming it (one line)."""
        try:
            self._server = make_server(self._host, self._port, self._app, handler_class=_QuietHandler)
        except OSError as exc:
            raise SettingsError(
                f"the health endpoint cannot listen on {self._host}:{self._port}: {exc.strerror or exc}"
                " (--health-port or $PLEXUS_HEALTH_PORT; 0 picks a free port)"
            ) from None
        self._beat = time.monotonic()
        self._task = asyncio.create_task(self._heartbeat(), name="plexus-health-beat")
        threading.Thread(target=self._server.serve_forever, name="plexus-health", daemon=True).start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            await asyncio.to_thread(self._server.shutdown)
            self._server.server_close()

    async def _heartbeat(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(min(1.0, self.stall_s / 4))

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            lag = time.monotonic() - self._beat
            ok = lag < self.stall_s and self._alive()
            body: dict[str, Any] = {"ok": ok, "loop_lag_s": round(lag, 3)}
        elif path == "/readyz":
            try:
                checks = self._ready()
            except Exception:  # a check that cannot be evaluated is a failing one
                checks = {"checks_evaluated": False}
            ok = bool(checks) and all(checks.values())
            body = {"ready": ok, **checks}
        else:
            start_response("404 Not Found", [("Content-Type", "application/json")])
            return [b'{"error": "not found: /healthz and /readyz are served here"}']
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
        return [json.dumps(body).encode()]
