"""Fake LLM providers on real loopback sockets, speaking the real wire formats (for the official SDKs).

`FakeProvider` is a minimal HTTP/1.1 server (one request per connection, ``Connection: close``; with
``keep_alive=True`` a connection serves one request after another, as real providers' do) driven by a
responder: a function of the parsed request body that returns a `Sse` stream, a `Status` error or a
`Drop` (the stream cut mid-way). It counts requests and records every body. The frame builders below make
the provider-shaped streams: OpenAI chat-completion chunks and Anthropic message events.

The token-count endpoints (Anthropic ``/messages/count_tokens``, OpenAI ``/responses/input_tokens``,
Gemini ``models/<model>:countTokens``) are answered by ``counter`` apart from the responder, in each one's
JSON shape, and recorded in ``count_requests`` (``requests`` and ``count`` stay the generation calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Drop",
    "FakeProvider",
    "Sse",
    "Status",
    "anthropic_frames",
    "openai_frames",
]


@dataclass(frozen=True)
class Sse:
    """A 200 ``text/event-stream`` answer made of raw SSE frames."""

    frames: Sequence[str]


@dataclass(frozen=True)
class Drop:
    """Send the first ``frames`` then close the socket without finishing the stream."""

    frames: Sequence[str]


@dataclass(frozen=True)
class Status:
    """A non-200 answer with a JSON body and headers (e.g. 429 with ``retry-after``)."""

    code: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


Answer = Sse | Drop | Status
Responder = Callable[[dict[str, Any]], Answer]
#: The answer of a token-count request: the count (sent in the endpoint's shape) or an error.
Counter = Callable[[dict[str, Any]], int | Status]
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 429: "Too Many Requests", 500: "Server Error"}


class FakeProvider:
    """``async with FakeProvider(responder) as fake``: serves on ``fake.base_url`` until the block ends.

    ``requests`` holds every parsed JSON body in arrival order, ``paths`` the request paths; a responder
    may block (await nothing: it is sync) — use `hold` to make the Nth request wait on an event instead.
    """

    def __init__(
        self,
        responder: Responder,
        *,
        base_path: str = "/v1",
        keep_alive: bool = False,
        counter: Counter | None = None,
    ) -> None:
        self._responder = responder
        self._counter = counter
        #: the bodies of the token-count requests, in arrival order
        self.count_requests: list[dict[str, Any]] = []
        self._base_path = base_path
        self._connection = b"keep-alive" if keep_alive else b"close"
        #: connections accepted so far (with ``keep_alive``, fewer than requests)
        self.connections = 0
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self._server: asyncio.Server | None = None
        #: request number (1-based) -> event the answer waits for; `arrived` fires when it comes in.
        self.holds: dict[int, asyncio.Event] = {}
        self.arrived: dict[int, asyncio.Event] = {}

    def hold(self, n: int) -> tuple[asyncio.Event, asyncio.Event]:
        """Make request ``n`` wait until the returned release event is set; the first event is its arrival."""
        self.arrived[n] = asyncio.Event()
        self.holds[n] = asyncio.Event()
        return self.arrived[n], self.holds[n]

    @property
    def count(self) -> int:
        return len(self.requests)

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}{self._base_path}"

    async def __aenter__(self) -> FakeProvider:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for event in self.holds.values():
            event.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await self._one(reader, writer) and self._connection == b"keep-alive":
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read and answer one request; False when the connection must close after it (a `Drop`)."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        parsed = json.loads(body) if body else {}
        shape = _count_shape(path)
        if shape is not None:
            self.count_requests.append(parsed)
            counted = (
                self._counter(parsed) if self._counter is not None else Status(404, {"error": "no counter"})
            )
            await self._answer(
                writer, counted if isinstance(counted, Status) else Status(200, shape(counted))
            )
            return True
        self.requests.append(parsed)
        self.paths.append(path)
        self.headers.append(headers)
        n = len(self.requests)
        if n in self.arrived:
            self.arrived[n].set()
            await self.holds[n].wait()
        answer = self._responder(parsed)
        await self._answer(writer, answer)
        return not isinstance(answer, Drop)

    async def _answer(self, writer: asyncio.StreamWriter, answer: Answer) -> None:
        if isinstance(answer, Status):
            payload = json.dumps(answer.body).encode()
            extra = "".join(f"{k}: {v}\r\n" for k, v in answer.headers.items())
            reason = _REASONS.get(answer.code, "Error")
            writer.write(
                f"HTTP/1.1 {answer.code} {reason}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(payload)}\r\n{extra}".encode()
                + b"connection: "
                + self._connection
                + b"\r\n\r\n"
                + payload
            )
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n")
        writer.write(b"transfer-encoding: chunked\r\nconnection: " + self._connection + b"\r\n\r\n")
        for frame in answer.frames:
            data = frame.encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()
        if isinstance(answer, Sse):
            writer.write(b"0\r\n\r\n")  # a Drop ends without the terminating chunk: a broken body
        await writer.drain()


def _count_shape(path: str) -> Callable[[int], dict[str, Any]] | None:
    """The JSON body a token-count endpoint answers with, by the request's path (None: not a count)."""
    path = path.split("?")[0]
    if path.endswith("/messages/count_tokens"):
        return lambda n: {"input_tokens": n}
    if path.endswith("/responses/input_tokens"):
        return lambda n: {"object": "response.input_tokens", "input_tokens": n}
    if path.endswith(":countTokens"):
        return lambda n: {"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}
    return None


# -- OpenAI chat-completion chunks --------------------------------------------------------------------


def _openai_chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> str:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake-model",
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return f"data: {json.dumps(chunk)}\n\n"


def openai_frames(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    *,
    first_index: int = 0,
    split: int = 4,
    finish: str | None = None,
    usage: tuple[int, int] = (12, 7),
) -> list[str]:
    """Chunks of one streamed answer: ``text`` in pieces, each tool call (id, name, arguments JSON text)
    as a head chunk then argument fragments of ``split`` characters with no id or name, then the finish
    chunk, the usage chunk (``stream_options.include_usage``) and ``[DONE]``."""
    frames = [_openai_chunk({"role": "assistant", "content": ""})]
    for i in range(0, len(text), 5):
        frames.append(_openai_chunk({"content": text[i : i + 5]}))
    for n, (call_id, name, arguments) in enumerate(tool_calls):
        index = first_index + n
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        frames.append(_openai_chunk({"tool_calls": [head]}))
        for i in range(0, len(arguments), split):
            piece = {"index": index, "function": {"arguments": arguments[i : i + split]}}
            frames.append(_openai_chunk({"tool_calls": [piece]}))
    frames.append(_openai_chunk({}, finish or ("tool_calls" if tool_calls else "stop")))
    prompt, completion = usage
    frames.append(
        _openai_chunk(
            None,
            usage={
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        )
    )
    frames.append("data: [DONE]\n\n")
    return frames


# -- Anthropic message events -------------------------------------------------------------------------


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"


def anthropic_frames(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    *,
    thinking: tuple[str, str] | None = None,
    split: int = 4,
    stop_reason: str | None = None,
    usage: tuple[int, int] = (12, 7),
) -> list[str]:
    """Events of one streamed Messages answer: optional thinking (text, signature) with thinking_delta and
    signature_delta, text, tool_use blocks whose input arrives as input_json_delta fragments (none for a
    ``""`` arguments text: zero-argument tools), message_delta with the stop reason and usage."""
    prompt, completion = usage
    frames = [
        _event(
            "message_start",
            {
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": "fake-claude",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": prompt, "output_tokens": 1},
                }
            },
        )
    ]
    index = 0
    if thinking is not None:
        thought, signature = thinking
        frames.append(
            _event(
                "content_block_start",
                {"index": index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
            )
        )
        for i in range(0, len(thought), 6):
            delta = {"type": "thinking_delta", "thinking": thought[i : i + 6]}
            frames.append(_event("content_block_delta", {"index": index, "delta": delta}))
        frames.append(
            _event(
                "content_block_delta",
                {"index": index, "delta": {"type": "signature_delta", "signature": signature}},
            )
        )
        frames.append(_event("content_block_stop", {"index": index}))
        index += 1
    if text:
        frames.append(
            _event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
        )
        for i in range(0, len(text), 5):
            delta = {"type": "text_delta", "text": text[i : i + 5]}
            frames.append(_event("content_block_delta", {"index": index, "delta": delta}))
        frames.append(_event("content_block_stop", {"index": index}))
        index += 1
    for call_id, name, arguments in tool_calls:
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        frames.append(_event("content_block_start", {"index": index, "content_block": block}))
        for i in range(0, len(arguments), split):
            delta = {"type": "input_json_delta", "partial_json": arguments[i : i + split]}
            frames.append(_event("content_block_delta", {"index": index, "delta": delta}))
        frames.append(_event("content_block_stop", {"index": index}))
        index += 1
    reason = stop_reason or ("tool_use" if tool_calls else "end_turn")
    frames.append(
        _event(
            "message_delta",
            {"delta": {"stop_reason": reason, "stop_sequence": None}, "usage": {"output_tokens": completion}},
        )
    )
    frames.append(_event("message_stop", {}))
    return frames
