"""Plexus agent types as MCP tools, over the official ``mcp`` SDK's low-level `Server`.

Each exposed agent type is one tool named after the type. Its input is ``{"text": ...}`` (a TextBlock),
or, when the type's registry entry declares ``metadata["input_schema"]`` (a JSON Schema, as JSON text), an
object of that schema (a DataBlock); either way an optional ``key`` picks the agent (`AgentId.key`). A
call is an orchestrated run (`Runtime.start_run` + `Runtime.run_result`): its progress events go to the
caller as MCP progress notifications when the call carried a progress token, a ``notifications/cancelled``
(or a client that goes away) cancels the run, and the reply blocks come back as MCP content. Without an
orchestrator the call is one `send_message` (no progress, nothing to cancel but the wait).

``mcp`` is imported by this module only, and this module only by ``plexus mcp serve``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import mcp.types as mt
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from plexus.core import (
    AgentId,
    AudioBlock,
    BaseBlock,
    CodeBlock,
    DataBlock,
    ErrorBlock,
    ImageBlock,
    KernelError,
    RunId,
    TextBlock,
    content_block_to_dict,
)
from plexus.runtime import Runtime, ServiceUnavailableError
from plexus.runtime.kernel import AgentTypeInfo

from ._mcp_progress import ProgressRelay

__all__ = ["INPUT_SCHEMA_KEY", "AgentTools", "mcp_server"]

log = logging.getLogger("plexus.gateway.mcp")

#: The registry metadata key under which an agent type may declare its MCP input schema (JSON text).
INPUT_SCHEMA_KEY = "input_schema"

_KEY_PROPERTY: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "description": "which agent of the type answers (its state and conversation); default: one per MCP "
    "session",
}
_TEXT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "description": "the message to the agent"},
        "key": _KEY_PROPERTY,
    },
    "required": ["text"],
    "additionalProperties": False,
}
_NOT_KEY = re.compile(r"[^A-Za-z0-9_\-]")


class _BadArguments(Exception):
    """The arguments do not fit the tool's schema: an error result the model can read and correct."""


class AgentTools:
    """The tools of one ``plexus mcp serve``: ``exposed`` agent types of ``rt``'s namespace.

    ``session_key`` is the agent key a call without ``key`` uses when the transport has no session id
    (stdio: one process serves one client). ``timeout_s`` bounds one call; a call that outlives it
    cancels its run rather than leave it running for nobody.
    """

    def __init__(
        self, rt: Runtime, exposed: Iterable[str], *, session_key: str | None = None, timeout_s: float = 600.0
    ) -> None:
        self.rt = rt
        self.exposed = frozenset(exposed)
        self.session_key = session_key
        self.timeout_s = timeout_s
        #: Cancellations still being sent when their call was interrupted (kept so they are not collected).
        self._cancels: set[asyncio.Task[Any]] = set()

    # -- listing --------------------------------------------------------------------------------------
    async def types(self) -> dict[str, AgentTypeInfo]:
        infos = await self.rt.agent_types(self.rt.namespace)
        return {t.type: t for t in infos if t.type in self.exposed}

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: mt.PaginatedRequestParams | None
    ) -> mt.ListToolsResult:
        tools = [
            mt.Tool(
                name=name,
                description=info.description or f"the Plexus agent type {name!r}",
                input_schema=_input_schema(info),
            )
            for name, info in sorted((await self.types()).items())
        ]
        return mt.ListToolsResult(tools=tools)

    # -- calling --------------------------------------------------------------------------------------
    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: mt.CallToolRequestParams
    ) -> mt.CallToolResult:
        info = (await self.types()).get(params.name)
        if info is None:
            # Not a tool of this server (unknown, or a type that is not exposed): a protocol error per
            # the spec, and the same one either way so a caller learns nothing about unexposed types.
            raise MCPError(mt.INVALID_PARAMS, f"Unknown tool: {params.name}")
        try:
            agent_id, blocks = self._request(info, dict(params.arguments or {}), ctx)
        except _BadArguments as exc:
            return _error_result(f"invalid arguments: {exc}")
        token = (ctx.meta or {}).get("progress_token")
        try:
            reply = await self._run(agent_id, blocks, ctx if token is not None else None)
        except KernelError as exc:
            return _error_result(f"{exc.error_type}: {exc}")
        return await self._result(reply)

    def _request(
        self, info: AgentTypeInfo, arguments: dict[str, Any], ctx: ServerRequestContext[Any]
    ) -> tuple[AgentId, list[BaseBlock]]:
        key = arguments.pop("key", None)
        if key is not None and not isinstance(key, str):
            raise _BadArguments("key: must be a string")
        declared = _declared_schema(info)
        if declared is None:
            _check(_TEXT_SCHEMA, {**arguments, **({"key": key} if key is not None else {})})
            blocks: list[BaseBlock] = [TextBlock(text=arguments["text"])]
        else:
            _check(declared, arguments)
            blocks = [DataBlock(data=arguments)]
        try:
            agent_id = AgentId(info.type, key or self._default_key(ctx), info.namespace)
        except ValueError as exc:
            raise _BadArguments(f"key: {exc}") from None
        return agent_id, blocks

    def _default_key(self, ctx: ServerRequestContext[Any]) -> str:
        """One agent per MCP session: a client's calls continue one conversation, and two clients never
        share (nor serialize behind) one agent's state. A handshake-era streamable HTTP session has an
        ``Mcp-Session-Id``; stdio has one client per process; the 2026-07-28 protocol has no session at
        all, so there each call without ``key`` gets an agent of its own."""
        request = ctx.request
        headers = getattr(request, "headers", None)
        session = headers.get("mcp-session-id") if headers is not None else None
        if session:
            return "mcp-" + _NOT_KEY.sub("_", session)[:120]
        return self.session_key or f"mcp-{RunId.new()}"

    async def _run(
        self, agent_id: AgentId, blocks: list[BaseBlock], progress: ServerRequestContext[Any] | None
    ) -> list[BaseBlock]:
        run_id = str(RunId.new())  # chosen here so a call interrupted while starting can still be cancelled
        try:
            await self.rt.start_run(agent_id, blocks, run_id=run_id)
        except ServiceUnavailableError:
            log.info("no orchestrator: %s answers a plain message (no progress, no run to cancel)", agent_id)
            return await self.rt.send_message(blocks, agent_id, timeout=self.timeout_s)
        except BaseException:
            await self._cancel(run_id, "the MCP call ended while its run was starting")
            raise
        relay = None
        if progress is not None:
            session = progress.session

            async def report(count: float, message: str) -> None:
                await session.report_progress(count, None, message)

            relay = ProgressRelay(self.rt, run_id, report)
        try:
            if relay is not None:
                await relay.start()
            reply = await self.rt.run_result(run_id, timeout=self.timeout_s)
            if relay is not None:
                await relay.finish()
            return reply
        except KernelError as exc:
            if exc.error_type == "ReplyTimeoutError":
                await self._cancel(run_id, f"the MCP call timed out after {self.timeout_s:g} s")
            raise
        except BaseException:
            # notifications/cancelled, or the client went away: the run ends with the call.
            await self._cancel(run_id, "cancelled by the MCP client")
            raise
        finally:
            if relay is not None:
                await relay.close()

    async def _cancel(self, run_id: str, reason: str) -> None:
        """Cancel the run even from inside a cancelled scope (the SDK interrupts a cancelled call's task)."""
        task = asyncio.ensure_future(self.rt.cancel_run(run_id, reason))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)
        task.add_done_callback(_log_failed_cancel)
        with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(task), 15.0)

    async def aclose(self) -> None:
        """Wait for cancellations still in flight (at shutdown)."""
        if self._cancels:
            await asyncio.wait(list(self._cancels), timeout=15.0)

    async def _result(self, reply: list[BaseBlock]) -> mt.CallToolResult:
        blocks = await self.rt.artifacts.resolve(reply)  # offloaded media come back inline
        content: list[mt.ContentBlock] = []
        data: list[dict[str, Any]] = []
        failed = False
        for block in blocks:
            content.append(_content(block))
            if isinstance(block, DataBlock):
                data.append(dict(block.data))
            failed = failed or isinstance(block, ErrorBlock)
        # One data block is the call's structured result (the spec asks for its JSON as text too).
        structured = data[0] if len(data) == 1 else None
        return mt.CallToolResult(content=content, structured_content=structured, is_error=failed)


def mcp_server(tools: AgentTools, *, version: str = "") -> Server[Any]:
    """The SDK's low-level server offering ``tools`` (stdio or streamable HTTP is the caller's choice)."""
    return Server(
        "plexus",
        version=version,
        description="Plexus agent types as MCP tools",
        on_list_tools=tools.list_tools,
        on_call_tool=tools.call_tool,
    )


# -- schemas ------------------------------------------------------------------------------------------------
def _declared_schema(info: AgentTypeInfo) -> dict[str, Any] | None:
    raw = info.metadata.get(INPUT_SCHEMA_KEY)
    if not raw:
        return None
    try:
        schema = json.loads(raw)
    except ValueError:
        log.warning(
            "agent type %s: metadata %r is not JSON; offering a text input", info.ref, INPUT_SCHEMA_KEY
        )
        return None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        log.warning(
            "agent type %s: the input schema is not an object schema; offering a text input", info.ref
        )
        return None
    return schema


def _input_schema(info: AgentTypeInfo) -> dict[str, Any]:
    declared = _declared_schema(info)
    if declared is None:
        return _TEXT_SCHEMA
    properties = dict(declared.get("properties") or {})
    properties.setdefault("key", _KEY_PROPERTY)
    return {**declared, "properties": properties}


def _check(schema: Mapping[str, Any], arguments: dict[str, Any]) -> None:
    # jsonschema (a dependency of mcp) ships no type stubs.
    from jsonschema.validators import validator_for  # type: ignore[import-untyped]

    validator = validator_for(schema)(schema)
    problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    if problems:
        raise _BadArguments(
            "; ".join(f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in problems)
        )


# -- content ------------------------------------------------------------------------------------------------
def _content(block: BaseBlock) -> mt.ContentBlock:
    if isinstance(block, TextBlock):
        return mt.TextContent(text=block.text)
    if isinstance(block, DataBlock):
        return mt.TextContent(text=json.dumps(block.data))
    if isinstance(block, CodeBlock):
        return mt.TextContent(text=f"```{block.language or ''}\n{block.code}\n```")
    if isinstance(block, ErrorBlock):
        return mt.TextContent(text=f"{block.error_type}: {block.message}")
    if isinstance(block, ImageBlock | AudioBlock) and block.data is not None:
        encoded = base64.b64encode(block.data).decode()
        mime = block.mime_type or "application/octet-stream"
        if isinstance(block, ImageBlock):
            return mt.ImageContent(data=encoded, mime_type=mime)
        return mt.AudioContent(data=encoded, mime_type=mime)
    # Anything else (a media block known only by URL, documents, tool records): its JSON, as text.
    return mt.TextContent(text=json.dumps(content_block_to_dict(block)))


def _error_result(text: str) -> mt.CallToolResult:
    return mt.CallToolResult(content=[mt.TextContent(text=text)], is_error=True)


def _log_failed_cancel(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("cancelling a run for an interrupted MCP call failed: %s", task.exception())
