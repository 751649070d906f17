"""The MCP server `bench.mcp_bench` calls: one ``add`` tool, served on stdin/stdout by the official SDK."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

app = MCPServer("bench")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    app.run()
