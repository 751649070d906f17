"""Bearer tokens, size limits and bad input: every refusal is a 4xx problem+json, never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from plexus.gateway import GatewayConfig, hash_token

from .conftest import Stack, StartGateway


def _problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = response.json()
    assert body["status"] == status
    return body


async def test_v1_needs_a_valid_bearer_token(gw: Stack) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as anonymous:
        _problem(await anonymous.get("/v1/agents"), 401)
        wrong = await anonymous.get("/v1/agents", headers={"Authorization": "Bearer nope"})
        assert _problem(wrong, 401)["title"] == "Unauthorized"
        assert wrong.headers["www-authenticate"] == "Bearer"
        # The dashboard page itself is public; its API calls carry the token.
        assert (await anonymous.get("/")).status_code == 200
        # EventSource cannot send headers: the token may come as access_token.
        ok = await anonymous.get("/v1/agents", params={"access_token": "test-token-0123456789"})
        assert ok.status_code == 200


async def test_dev_mode_is_open(start_gateway: StartGateway) -> None:
    stack = await start_gateway(GatewayConfig(dev=True))
    async with httpx.AsyncClient(base_url=stack.url) as anonymous:
        assert (await anonymous.get("/v1/agents")).status_code == 200


def test_config_refuses_plain_tokens() -> None:
    with pytest.raises(ValueError, match="sha256"):
        GatewayConfig(token_hashes=frozenset({"plain-token"}))
    assert GatewayConfig(token_hashes=frozenset({hash_token("t")})).allows("t")
    assert not GatewayConfig(token_hashes=frozenset({hash_token("t")})).allows("u")
    assert not GatewayConfig().allows(None)


async def test_oversized_bodies_are_refused(start_gateway: StartGateway) -> None:
    stack = await start_gateway(GatewayConfig(dev=True, max_body_bytes=1000))
    big = {"agent_id": "echo/x", "input": [{"type": "text", "text": "x" * 5000}]}
    _problem(await stack.client.post("/v1/runs", json=big), 413)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 500

    chunked = await stack.client.post(
        "/v1/runs", content=chunks(), headers={"content-type": "application/json"}
    )
    _problem(chunked, 413)


@pytest.mark.parametrize(
    ("method", "url", "body", "status"),
    [
        ("POST", "/v1/runs", "not json", 422),
        ("POST", "/v1/runs", {"agent_id": "no-slash", "input": []}, 422),
        ("POST", "/v1/runs", {"agent_id": "echo/a", "input": [{"type": 7}]}, 422),
        ("POST", "/v1/runs", {"agent_id": "echo/a", "input": [], "priority": 3}, 422),
        ("POST", "/v1/runs", {"agent_id": "echo/a", "input": [], "budget": {"max_tokens": 0}}, 422),
        ("POST", "/v1/runs", {"agent_id": "echo/a", "input": [], "surprise": 1}, 422),
        ("GET", "/v1/runs?status=exploded", None, 422),
        ("GET", "/v1/runs?cursor=garbage", None, 422),
        ("GET", "/v1/runs?limit=0", None, 422),
        ("GET", "/v1/runs/run_unknown", None, 404),
        ("GET", "/v1/runs/run_unknown/tree", None, 404),
        ("GET", "/v1/runs/run_unknown/events", None, 404),
        ("POST", "/v1/runs/run_unknown/cancel", None, 404),
        ("GET", "/v1/runs/bad%20id", None, 422),
        ("POST", "/v1/agents/echo/k/messages", {"input": [], "timeout_s": -1}, 422),
        ("POST", "/v1/agents/bad type/k/messages", {"input": []}, 422),
        ("GET", "/v1/nothing-here", None, 404),
    ],
)
async def test_bad_input_gets_a_typed_4xx(
    gw: Stack, method: str, url: str, body: object, status: int
) -> None:
    if isinstance(body, str):
        response = await gw.client.request(
            method, url, content=body, headers={"content-type": "application/json"}
        )
    else:
        response = await gw.client.request(method, url, json=body)
    _problem(response, status)


async def test_bad_last_event_id_is_refused(gw: Stack) -> None:
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "echo/l", "input": []})).json()["run_id"]
    _problem(await gw.client.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "abc"}), 422)
