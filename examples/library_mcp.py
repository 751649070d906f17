"""The research team's library as a small MCP server (stdio), written with the official ``mcp`` SDK.

`examples/research_team.py` gives its researchers this server's tools (``MCPServer.stdio``): each worker
starts one ``python library_mcp.py`` process at the first lookup and talks MCP to it over stdin/stdout.
Offline: the library is the dictionary below.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

LIBRARY = {
    "jetstream": "JetStream stores messages durably with per-subject sequences.",
    "leases": "Partition leases in a KV bucket decide which worker owns an agent key.",
}

server = MCPServer("library")


@server.tool()
def lookup(topic: str) -> str:
    """Look a topic up in the (offline) library."""
    return LIBRARY.get(topic.strip().lower(), f"nothing on {topic}")


if __name__ == "__main__":
    server.run()  # stdio
