"""`Gateway`: uvicorn serving `create_app` inside the caller's event loop (CLI, tests, `plexus dev`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

from plexus.runtime import Runtime

from ._app import create_app
from ._config import GatewayConfig

__all__ = ["Gateway"]


class Gateway:
    """``await Gateway(rt, config, port=0).start()`` binds (port 0 picks a free one); ``url`` is then set."""

    def __init__(
        self, runtime: Runtime, config: GatewayConfig, *, host: str = "127.0.0.1", port: int = 8470
    ) -> None:
        self.app = create_app(runtime, config)
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        # Bind ourselves so port 0 resolves to a known port before uvicorn starts serving.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._socket = sock
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
                raise RuntimeError("the gateway stopped while starting")
            await asyncio.sleep(0.01)

    async def serve_forever(self) -> None:
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._socket is not None:
            self._socket.close()
