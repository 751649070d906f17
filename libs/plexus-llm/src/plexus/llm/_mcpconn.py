"""One live session with one MCP server in this process, over the official ``mcp`` SDK.

A connection is shared by every agent of the process that names the same server (one stdio process per
worker, not per activation). It starts at its first use, starts again at the next use after the server
exited, and ends with the event loop it runs on (`plexus worker` ends its loop when it stops) or at
`close_mcp_connections`. The SDK's transports and `ClientSession` are async context managers whose anyio
task groups must be entered and left by one task: a task of the connection's own holds them open.
``mcp`` is imported here, and this module only when a connection is made (``import plexus.llm`` must
stay light).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._mcperrors import MCPProtocolError, MCPServerError, MCPTimeoutError

if TYPE_CHECKING:
    import mcp.types
    from mcp import ClientSession

__all__ = ["Connection", "close_mcp_connections", "connection_for"]

log = logging.getLogger("plexus.llm.mcp")

#: What opens the transport: an async context manager yielding the SDK's (read, write) streams.
TransportFactory = Callable[[], AbstractAsyncContextManager[tuple[Any, Any]]]

_CONNECTIONS: dict[tuple[Any, ...], Connection] = {}


def connection_for(key: tuple[Any, ...], name: str, transport: TransportFactory) -> Connection:
    """This process's connection to the server ``key`` names (made, not started, on first use)."""
    conn = _CONNECTIONS.get(key)
    if conn is None:
        conn = _CONNECTIONS[key] = Connection(name, transport)
    return conn


async def close_mcp_connections() -> None:
    """Stop every MCP connection of this process (stdio servers are stopped); the next use starts again."""
    conns = list(_CONNECTIONS.values())
    _CONNECTIONS.clear()
    for conn in conns:
        await conn.aclose()


class Connection:
    """One server's session: ``list_tools`` (cached until the server says its list changed, or a restart)
    and ``call``. Every failure is a typed `MCPServerError`."""

    def __init__(self, name: str, transport: TransportFactory) -> None:
        self.name = name
        self._transport = transport
        #: Made per event loop (`_start_lock`): an asyncio lock binds to the loop it first waited on, and this
        #: connection outlives a loop (a test's, or a script's `asyncio.run`) to start again on the next.
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Event | None = None
        self._tools: list[mcp.types.Tool] | None = None
        #: Bumped on every fresh listing, so views of the list rebuild only when it changed.
        self.version = 0

    # -- lifecycle ------------------------------------------------------------------------------------
    async def session(self, connect_timeout_s: float) -> ClientSession:
        """The live session, started (or started again after the server exited) when there is none."""
        session = self._live()
        if session is not None:
            return session
        async with self._start_lock():
            session = self._live()
            if session is None:
                session = await self._start(connect_timeout_s)
            return session

    def _start_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    def _live(self) -> ClientSession | None:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._done is None or self._done.is_set():
            return None
        return self._session

    async def _start(self, connect_timeout_s: float) -> ClientSession:
        if self._task is not None and self._loop is asyncio.get_running_loop():
            await self._stop_task()
        self._session = None
        self._tools = None
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        ready: asyncio.Future[ClientSession] = self._loop.create_future()
        self._task = asyncio.ensure_future(self._hold(ready, self._done))
        try:
            async with asyncio.timeout(connect_timeout_s):
                self._session = await asyncio.shield(ready)
        except TimeoutError:
            await self._stop_task()
            raise MCPServerError(
                f"MCP server {self.name!r} did not complete its handshake within {connect_timeout_s} s",
                self.name,
            ) from None
        except MCPServerError:
            await self._stop_task()
            raise
        log.info("MCP server %r connected", self.name)
        return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession], done: asyncio.Event) -> None:
        """Open the transport and the session, hand the session over, and hold both until stopped or until
        the server's stream ends (it exited, or the HTTP server went away)."""
        from mcp import ClientSession

        try:
            async with self._transport() as (read, write):
                watched = _WatchedRead(read, done)
                async with ClientSession(watched, write, message_handler=self._on_message) as session:
                    await session.initialize()
                    ready.set_result(session)
                    await done.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as exc:  # the SDK's task groups raise groups: report the first real cause
            cause = _first_cause(exc)
            if not ready.done():
                ready.set_exception(_typed(self.name, cause, "could not start"))
            else:
                log.warning("MCP server %r connection ended: %s", self.name, cause)
        finally:
            done.set()
            if ready.done() and not ready.cancelled() and ready.exception() is None:
                log.info("MCP server %r disconnected", self.name)

    async def _on_message(self, message: Any) -> None:
        import mcp.types

        if isinstance(message, mcp.types.ToolListChangedNotification):
            self._tools = None  # listed again before the next model call
        elif isinstance(message, Exception):
            log.warning("MCP server %r sent something that is not MCP: %s", self.name, message)

    async def _stop_task(self) -> None:
        task, self._task = self._task, None
        if self._done is not None:
            self._done.set()
        if task is not None:
            try:
                async with asyncio.timeout(10):
                    await asyncio.wait({task})
            except TimeoutError:
                task.cancel()
                await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: its failure was reported through `ready` or the log

    async def aclose(self) -> None:
        """Stop the session (a stdio server's process with it)."""
        if self._loop is asyncio.get_running_loop():
            await self._stop_task()
        self._session = None
        self._tools = None

    # -- requests -------------------------------------------------------------------------------------
    async def list_tools(self, connect_timeout_s: float, timeout_s: float) -> list[mcp.types.Tool]:
        """The server's tools, from the cache while the server has not said they changed."""
        session = await self.session(connect_timeout_s)
        tools = self._tools
        if tools is not None:
            return tools
        async with self._errors("list_tools", timeout_s):
            listed: list[mcp.types.Tool] = []
            cursor: str | None = None
            while True:
                import mcp.types

                params = mcp.types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        self._tools = listed
        self.version += 1
        return listed

    async def call(
        self, tool: str, arguments: dict[str, Any], connect_timeout_s: float, timeout_s: float
    ) -> mcp.types.CallToolResult:
        session = await self.session(connect_timeout_s)
        async with self._errors(f"the call of {tool!r}", timeout_s):
            result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        import mcp.types

        if not isinstance(result, mcp.types.CallToolResult):
            raise MCPProtocolError(
                f"MCP server {self.name!r} answered {tool!r} with a {type(result).__name__}", self.name
            )
        return result

    @contextlib.asynccontextmanager
    async def _errors(self, what: str, timeout_s: float) -> AsyncIterator[None]:
        """Map the SDK's failures onto typed errors; the outer timeout backs up the SDK's own."""
        try:
            async with asyncio.timeout(timeout_s + 5):
                yield
        except TimeoutError:
            raise MCPTimeoutError(
                f"MCP server {self.name!r}: {what} took longer than {timeout_s} s", self.name
            ) from None
        except MCPServerError:
            raise
        except Exception as exc:
            raise _typed(self.name, exc, what) from None


def _first_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _typed(name: str, exc: BaseException, what: str) -> MCPServerError:
    """The typed error for one of the SDK's (or the OS's) failures."""
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    exc = _first_cause(exc)
    if isinstance(exc, MCPServerError):
        return exc
    if isinstance(exc, MCPError):
        if exc.code == CONNECTION_CLOSED:
            return MCPServerError(f"MCP server {name!r} closed the connection during {what}", name)
        if exc.code == REQUEST_TIMEOUT:
            return MCPTimeoutError(f"MCP server {name!r}: {what} timed out ({exc.message})", name)
        return MCPProtocolError(f"MCP server {name!r} refused {what}: {exc.message} (code {exc.code})", name)
    if isinstance(exc, OSError):
        return MCPServerError(f"MCP server {name!r}: {what}: {type(exc).__name__}: {exc}", name)
    return MCPProtocolError(f"MCP server {name!r}: {what}: {type(exc).__name__}: {exc}", name)


class _WatchedRead:
    """The transport's read stream, setting ``ended`` when it ends: the server exited or went away, so the
    next use starts a new connection instead of failing on a dead one."""

    def __init__(self, inner: Any, ended: asyncio.Event) -> None:
        self._inner = inner
        self._ended = ended

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except Exception:
            self._ended.set()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, Exception):
            self._ended.set()
            raise

    async def __aenter__(self) -> _WatchedRead:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._ended.set()
        result: bool | None = await self._inner.__aexit__(exc_type, exc, tb)
        return result
