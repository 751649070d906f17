"""Typed MCP failures. A tool call's failure reaches the model as an ErrorBlock of that type (the loop goes
on); a server that cannot be started or listed fails the message with the error."""

from __future__ import annotations

from typing import ClassVar

from plexus.core import KernelError

__all__ = ["MCPProtocolError", "MCPServerError", "MCPTimeoutError", "MCPToolError"]


class MCPServerError(KernelError):
    """An MCP server could not be started or reached, or it exited (``server`` names it). The next use
    starts it again, so retrying may help."""

    fields: ClassVar[tuple[str, ...]] = ("message", "server")
    recoverable = True

    def __init__(self, message: str, server: str = "") -> None:
        super().__init__(message)
        self.server = server


class MCPProtocolError(MCPServerError):
    """The server answered something that is not valid MCP, or refused a request with a JSON-RPC error."""


class MCPTimeoutError(MCPServerError):
    """A request to the server got no answer within its timeout (``MCPServer(..., timeout_s=...)``)."""


class MCPToolError(KernelError):
    """The server ran the tool and reported a failure (an ``isError`` result); ``message`` is its text."""

    fields: ClassVar[tuple[str, ...]] = ("message", "server", "tool")
    recoverable = True

    def __init__(self, message: str, server: str = "", tool: str = "") -> None:
        super().__init__(message)
        self.server = server
        self.tool = tool
