"""Real MCP servers written with the official SDK, for the MCP tool-source tests.

``python tests/llm/mcp_servers.py stdio`` serves `build()` on stdin/stdout; ``garbage`` writes lines that are
not JSON-RPC and never answers. `build()` is also served over streamable HTTP by the tests (in-process,
uvicorn on loopback). ``MCP_LOG`` (a path): each call appends ``<tool> <argument>`` and the server's pid
appends ``pid <n>`` when it starts; ``MCP_GATE`` (a path): ``gate`` touches ``<path>.entered`` and waits until
the path exists.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer


def _log(line: str) -> None:
    path = os.environ.get("MCP_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def build() -> MCPServer:
    app = MCPServer("testsrv")

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        _log(f"add {a} {b}")
        return a + b

    @app.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        _log(f"echo {text}")
        return f"echo: {text}"

    @app.tool()
    def fail(reason: str) -> str:
        """Always fails."""
        _log(f"fail {reason}")
        raise ValueError(f"refused: {reason}")

    @app.tool()
    def crash() -> str:
        """Exits the server in the middle of the call."""
        _log("crash")
        os._exit(3)

    @app.tool()
    async def hang() -> str:
        """Never answers."""
        _log("hang")
        await asyncio.sleep(3600)
        return "late"

    @app.tool()
    async def gate(text: str) -> str:
        """Waits for the test's gate file, then answers."""
        _log(f"gate {text}")
        gate_path = os.environ["MCP_GATE"]
        Path(gate_path + ".entered").touch()  # noqa: ASYNC240 - a test server
        while not os.path.exists(gate_path):  # noqa: ASYNC110, ASYNC240 - the test creates it
            await asyncio.sleep(0.05)
        return f"passed: {text}"

    @app.tool()
    async def grow(ctx: Context) -> str:
        """Adds the tool ``extra`` and tells the client its tool list changed."""
        _log("grow")

        @app.tool()
        def extra(text: str) -> str:
            """A tool that appeared later."""
            _log(f"extra {text}")
            return text.upper()

        await ctx.session.send_tool_list_changed()
        return "grown"

    @app.tool()
    def bad(x: str) -> str:
        """Its schema is replaced by an invalid one below."""
        return x

    # A schema no JSON Schema validator accepts: the client must not offer this tool.
    app._tool_manager.get_tool("bad").parameters = {  # type: ignore[union-attr]
        "type": "object",
        "properties": {"x": {"type": "banana"}},
    }
    return app


def main() -> None:
    kind = sys.argv[1]
    _log(f"pid {os.getpid()}")
    if kind == "stdio":
        build().run()
    elif kind == "garbage":
        for line in sys.stdin:
            sys.stdout.write("this is not json-rpc\n")
            sys.stdout.flush()
            del line
    else:
        raise SystemExit(f"unknown kind {kind!r}")


if __name__ == "__main__":
    main()
