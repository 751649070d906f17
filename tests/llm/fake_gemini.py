"""A fake Gemini API on a real loopback socket: ``models/<model>:streamGenerateContent?alt=sse`` as the
official ``google-genai`` SDK reads it, served by `FakeProvider` (``base_path=""``; the SDK adds
``/v1beta/...``).

`gemini_frames` builds the SSE chunks of one answer (``GenerateContentResponse`` JSON, camelCase as on the
wire). `Signatures` plays the service's thought-signature rule: it makes the signatures the fake hands out
and answers a request that sends one back changed, or sends a signed function call back without its
signature, with the 400 the real service gives.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from google import genai
from google.genai import types

from .fake_providers import FakeProvider, Status

__all__ = ["GeminiCall", "Signatures", "gemini_chunk", "gemini_client", "gemini_frames", "turn_of"]

MISSING = "Function call is missing a thought_signature in functionCall parts."


def gemini_client(fake: FakeProvider) -> genai.Client:
    """The official SDK's client pointed at ``fake`` (which must serve with ``base_path=""``)."""
    return genai.Client(
        api_key="test-key", http_options=types.HttpOptions(base_url=fake.base_url, api_version="v1beta")
    )


@dataclass(frozen=True)
class GeminiCall:
    """A function call part: its name, args (any JSON: a non-object is malformed), optional id and
    signature bytes."""

    name: str
    args: Any = field(default_factory=dict)
    signature: bytes | None = None
    id: str | None = None

    def part(self) -> dict[str, Any]:
        call: dict[str, Any] = {"name": self.name, "args": self.args}
        if self.id is not None:
            call["id"] = self.id
        part: dict[str, Any] = {"functionCall": call}
        if self.signature is not None:
            part["thoughtSignature"] = base64.b64encode(self.signature).decode()
        return part


def gemini_chunk(
    parts: Sequence[dict[str, Any]] = (),
    *,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
    feedback: dict[str, Any] | None = None,
) -> str:
    """One SSE frame: a ``GenerateContentResponse`` with one candidate (none when ``feedback`` is given)."""
    chunk: dict[str, Any] = {"modelVersion": "fake-gemini", "responseId": "resp-fake"}
    if feedback is not None:
        chunk["promptFeedback"] = feedback
    else:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = finish
        chunk["candidates"] = [candidate]
    if usage is not None:
        chunk["usageMetadata"] = usage
    return f"data: {json.dumps(chunk)}\r\n\r\n"


def gemini_frames(
    text: str = "",
    calls: Sequence[GeminiCall] = (),
    *,
    thought: str = "",
    text_signature: bytes | None = None,
    finish: str = "STOP",
    usage: tuple[int, int] = (12, 7),
    thoughts_tokens: int = 0,
    cached_tokens: int = 0,
) -> list[str]:
    """The chunks of one streamed answer: ``thought`` summary pieces, ``text`` in pieces of 5 characters,
    the calls in one chunk (parallel calls, as Gemini sends them), then a last chunk with an empty text
    part carrying ``text_signature`` (when given), the finish reason and the usage."""
    frames = [
        gemini_chunk([{"text": thought[i : i + 6], "thought": True}]) for i in range(0, len(thought), 6)
    ]
    frames += [gemini_chunk([{"text": text[i : i + 5]}]) for i in range(0, len(text), 5)]
    if calls:
        frames.append(gemini_chunk([c.part() for c in calls]))
    last: list[dict[str, Any]] = []
    if text_signature is not None:
        last.append({"text": "", "thoughtSignature": base64.b64encode(text_signature).decode()})
    prompt, candidates = usage
    meta = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts_tokens,
    }
    if thoughts_tokens:
        meta["thoughtsTokenCount"] = thoughts_tokens
    if cached_tokens:
        meta["cachedContentTokenCount"] = cached_tokens
    frames.append(gemini_chunk(last, finish=finish, usage=meta))
    return frames


def turn_of(body: dict[str, Any]) -> int:
    """Which turn a request is for: one more than the model contents it carries."""
    return 1 + sum(1 for c in body.get("contents", []) if c.get("role") == "model")


def _decode(signature: str) -> bytes | None:
    """The SDK sends bytes URL-safe base64; the service issues standard base64: both decode."""
    try:
        return base64.b64decode(signature.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None


class Signatures:
    """Issue thought signatures and check them as the service does.

    ``issue(key)`` makes random signature bytes for the function call ``key`` (its name and args, as they
    go back). ``check(body)`` is None when every issued call in the request carries its signature
    unchanged and no part carries one never issued, else the 400 `Status`.
    """

    def __init__(self) -> None:
        self.issued: dict[str, bytes] = {}
        #: every signature seen coming back, as sent (the wire's base64 text)
        self.returned: list[str] = []

    @staticmethod
    def key(name: str, args: Any) -> str:
        return json.dumps([name, args], sort_keys=True)

    def issue(self, name: str, args: Any) -> bytes:
        signature = b"\xfb\xff" + os.urandom(30)  # bytes whose base64 differs between the two alphabets
        self.issued[self.key(name, args)] = signature
        return signature

    def call(self, name: str, args: Any) -> GeminiCall:
        return GeminiCall(name, args, self.issue(name, args))

    def check(self, body: dict[str, Any]) -> Status | None:
        known = set(self.issued.values())
        for content in body.get("contents", []):
            if content.get("role") != "model":
                continue
            for part in content.get("parts", []):
                sent = part.get("thoughtSignature")
                if sent is not None:
                    self.returned.append(sent)
                    if _decode(sent) not in known:
                        return _invalid("Corrupted thought signature.")
                call = part.get("functionCall")
                if call is None:
                    continue
                expected = self.issued.get(self.key(call.get("name"), call.get("args", {})))
                if expected is None:
                    continue
                if sent is None:
                    return _invalid(MISSING)
                if _decode(sent) != expected:
                    return _invalid("Corrupted thought signature.")
        return None


def _invalid(message: str) -> Status:
    return Status(400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})
