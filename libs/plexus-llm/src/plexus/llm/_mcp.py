"""MCP servers as tool sources: ``LLMAgent(tools=[..., MCPServer.stdio("uvx", ["mcp-server-fetch"])])``.

The server's tools are listed over the official ``mcp`` SDK and offered to the model with their JSON
Schemas, each named ``<prefix><tool>``; a call goes through the loop's tool step like any tool (the
journal, approvals, middleware, the EventLog records), and every MCP failure becomes an ErrorBlock the
model sees. The session itself is per process (`_mcpconn.py`). ``mcp`` and ``jsonschema`` are imported
when a server is first used, never by ``import plexus.llm``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from plexus.core import BaseBlock, DataBlock, JsonValue, TextBlock
from plexus.runtime import Context

from ._mcpconn import Connection, TransportFactory, close_mcp_connections, connection_for
from ._mcperrors import MCPToolError
from ._tools import Tool, ToolArgumentsError

if TYPE_CHECKING:
    import mcp.types

__all__ = ["MCPServer", "MCPTool", "close_mcp_connections"]

log = logging.getLogger("plexus.llm.mcp")

#: What the providers accept as a tool name (OpenAI: ``^[a-zA-Z0-9_-]{1,64}$``).
_NAME_MAX = 64
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")

ToolFilter = Callable[[str], bool] | Collection[str]


class _AnyArguments(BaseModel):
    """Placeholder arguments model: an MCP tool's arguments are checked against its JSON Schema."""

    model_config = ConfigDict(extra="allow")


def _never_called(**_kwargs: Any) -> None:  # pragma: no cover - MCPTool.invoke replaces the call
    raise RuntimeError("an MCP tool is called through its server")


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool an MCP server listed; ``mcp_name`` is its name on the server."""

    server: MCPServer | None = None
    mcp_name: str = ""
    validator: Any = None

    async def invoke(self, arguments: dict[str, JsonValue], ctx: Context | None) -> Any:
        """Check ``arguments`` against the tool's JSON Schema (ToolArgumentsError), call it on its server;
        an ``isError`` result raises `MCPToolError`, a server failure an `MCPServerError`."""
        problems = sorted(self.validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            raise ToolArgumentsError(
                "; ".join(f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in problems)
            )
        assert self.server is not None
        result = await self.server.call(self.mcp_name, dict(arguments))
        blocks = _blocks(result)
        if result.is_error:
            text = " ".join(b.text for b in blocks if isinstance(b, TextBlock)) or "the tool failed"
            raise MCPToolError(text, self.server.name, self.mcp_name)
        return blocks


class MCPServer:
    """An MCP server whose tools an `LLMAgent` offers: `MCPServer.stdio` (a process per worker, started at
    first use, again after it exits) or `MCPServer.http` (streamable HTTP).

    ``name`` prefixes the tools (``prefix`` defaults to ``"<name>_"``; ``""`` for none) and names the server
    in errors; ``tool_filter`` (names on the server, or a predicate on them) selects tools;
    ``needs_approval`` (True, or names on the server) gates calls behind `approve`; ``timeout_s`` bounds one
    call or listing, ``connect_timeout_s`` the start and handshake. Agents of one process that name the same
    server (command, arguments and environment, or URL and headers) share one session.
    """

    def __init__(
        self,
        name: str,
        key: tuple[Any, ...],
        transport: TransportFactory,
        *,
        prefix: str | None = None,
        tool_filter: ToolFilter | None = None,
        needs_approval: bool | Collection[str] = False,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 30.0,
    ) -> None:
        if not timeout_s > 0 or not connect_timeout_s > 0:
            raise ValueError(f"timeouts must be > 0, got {timeout_s} and {connect_timeout_s}")
        self.name = name
        self.prefix = f"{name}_" if prefix is None else prefix
        if _NOT_NAME.search(self.prefix):
            raise ValueError(f"prefix {self.prefix!r} may hold only letters, digits, '_' and '-'")
        self.key = key
        self._transport = transport
        self._filter = tool_filter
        self._approval = needs_approval
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        #: Tools the server listed with an input schema that is not a valid JSON Schema (name -> why):
        #: they are not offered to the model.
        self.invalid_tools: dict[str, str] = {}
        self._listed: tuple[list[mcp.types.Tool], list[Tool]] | None = None

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        cwd: str | None = None,
        name: str | None = None,
        prefix: str | None = None,
        tool_filter: ToolFilter | None = None,
        needs_approval: bool | Collection[str] = False,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 30.0,
    ) -> MCPServer:
        """A server run as ``command args`` with ``env`` over the SDK's default environment (PATH, HOME...).
        ``name`` defaults to the first argument that is not an option, else the command's file name."""
        arguments = list(args)
        variables = dict(env or {})
        default = next((a for a in arguments if not a.startswith("-")), command)

        @asynccontextmanager
        async def transport() -> AsyncIterator[tuple[Any, Any]]:
            from mcp import StdioServerParameters, stdio_client

            params = StdioServerParameters(command=command, args=arguments, env=variables or None, cwd=cwd)
            async with stdio_client(params) as streams:
                yield streams

        key = ("stdio", command, tuple(arguments), tuple(sorted(variables.items())), cwd)
        return cls(
            name or _sanitize(Path(default).name.removesuffix(".py")),
            key,
            transport,
            prefix=prefix,
            tool_filter=tool_filter,
            needs_approval=needs_approval,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
        )

    @classmethod
    def http(
        cls,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        prefix: str | None = None,
        tool_filter: ToolFilter | None = None,
        needs_approval: bool | Collection[str] = False,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 30.0,
    ) -> MCPServer:
        """A server at ``url`` over streamable HTTP, every request with ``headers`` (e.g. authorization).
        ``name`` defaults to the URL's host."""
        fixed = dict(headers or {})

        @asynccontextmanager
        async def transport() -> AsyncIterator[tuple[Any, Any]]:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            # The SDK's recommended timeouts: a server may hold a response stream open for long.
            timeout = httpx2.Timeout(30.0, read=300.0)
            async with (
                httpx2.AsyncClient(headers=fixed, timeout=timeout) as client,
                streamable_http_client(url, http_client=client) as (read, write),
            ):
                yield read, write

        host = re.sub(r"^[a-z]+://", "", url).split("/")[0].split(":")[0]
        key = ("http", url, tuple(sorted(fixed.items())))
        return cls(
            name or _sanitize(host),
            key,
            transport,
            prefix=prefix,
            tool_filter=tool_filter,
            needs_approval=needs_approval,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
        )

    @property
    def connection(self) -> Connection:
        return connection_for(self.key, self.name, self._transport)

    async def list_tools(self) -> Sequence[Tool]:
        """The tools on offer (`ToolSource`): the same list object until the server's list changes."""
        listed = await self.connection.list_tools(self.connect_timeout_s, self.timeout_s)
        if self._listed is not None and self._listed[0] is listed:
            return self._listed[1]
        tools = self._tools(listed)
        self._listed = (listed, tools)
        return tools

    async def call(self, tool: str, arguments: dict[str, Any]) -> mcp.types.CallToolResult:
        """One ``tools/call`` (typed errors: `MCPServerError` and its subclasses)."""
        return await self.connection.call(tool, arguments, self.connect_timeout_s, self.timeout_s)

    async def aclose(self) -> None:
        """Stop this server's session in this process (a stdio server's process too)."""
        await self.connection.aclose()

    def _tools(self, listed: list[mcp.types.Tool]) -> list[Tool]:
        # jsonschema (a dependency of mcp) ships no type stubs.
        from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
        from jsonschema.validators import validator_for  # type: ignore[import-untyped]

        tools: list[Tool] = []
        invalid: dict[str, str] = {}
        for t in listed:
            if not self._selected(t.name):
                continue
            schema: dict[str, Any] = dict(t.input_schema)
            try:
                cls = validator_for(schema)
                cls.check_schema(schema)
                if schema.get("type", "object") != "object":
                    raise SchemaError(f"the arguments must be an object, not {schema.get('type')!r}")
            except SchemaError as exc:
                invalid[t.name] = exc.message
                log.warning(
                    "MCP server %r: tool %r has an invalid input schema, not offered: %s",
                    self.name,
                    t.name,
                    exc.message,
                )
                continue
            approval = self._approval if isinstance(self._approval, bool) else t.name in self._approval
            tools.append(
                MCPTool(
                    name=(self.prefix + _sanitize(t.name))[:_NAME_MAX],
                    description=(t.description or t.title or "").strip(),
                    fn=_never_called,
                    arguments_model=_AnyArguments,
                    timeout_s=self.timeout_s,
                    schema=schema,
                    needs_approval=approval,
                    server=self,
                    mcp_name=t.name,
                    validator=cls(schema),
                )
            )
        self.invalid_tools = invalid
        return tools

    def _selected(self, name: str) -> bool:
        if self._filter is None:
            return True
        if callable(self._filter):
            return bool(self._filter(name))
        return name in self._filter


def _sanitize(name: str) -> str:
    return _NOT_NAME.sub("_", name) or "mcp"


def _blocks(result: mcp.types.CallToolResult) -> list[BaseBlock]:
    """A result's content as blocks: text as text, anything else (images, resources) as its JSON."""
    import mcp.types

    blocks: list[BaseBlock] = []
    for item in result.content:
        if isinstance(item, mcp.types.TextContent):
            blocks.append(TextBlock(text=item.text))
        else:
            blocks.append(DataBlock(data=item.model_dump(mode="json", by_alias=True, exclude_none=True)))
    if not blocks and result.structured_content is not None:
        blocks.append(DataBlock(data=dict(result.structured_content)))
    return blocks
