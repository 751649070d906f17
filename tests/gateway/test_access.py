"""Issue 14, item 4: the gateway's bearer tokens are hashed at rest in the tenant's own bucket, scoped to
that tenant, revocable while gateways run; callers are rate-limited; CORS is off unless asked for."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from plexus.gateway import Gateway, GatewayConfig
from plexus.runtime import NatsServer, Runtime
from plexus.runtime.kernel import NatsAuth
from plexus.runtime.ops._security import security_init

from .conftest import StartGateway

REPO = Path(__file__).resolve().parents[2]


def _tokens(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plexus.runtime.cli", "tokens", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        cwd=REPO,
        check=False,
    )


async def _status(url: str, token: str) -> int:
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.get(f"{url}/v1/agents", headers={"Authorization": f"Bearer {token}"})
        return resp.status_code


async def _until_status(url: str, token: str, status: int, timeout_s: float = 5.0) -> float:
    """Seconds until `token` gets `status` from the running gateway."""
    start = asyncio.get_running_loop().time()
    while (await _status(url, token)) != status:
        if asyncio.get_running_loop().time() - start > timeout_s:
            raise AssertionError(f"the gateway never answered {status}")
        await asyncio.sleep(0.05)
    return asyncio.get_running_loop().time() - start


async def test_a_token_created_while_the_gateway_runs_works_and_revoking_it_locks_it_out(
    start_gateway: StartGateway, nats_server: NatsServer
) -> None:
    stack = await start_gateway()
    created = await asyncio.to_thread(_tokens, "create", "ci-bot", "--nats", nats_server.url)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("pxg_")
    assert "not stored" in created.stderr
    await _until_status(stack.url, token, 200)
    # At rest: the name and the hash, never the token.
    listed = await asyncio.to_thread(_tokens, "ls", "--nats", nats_server.url)
    assert "ci-bot" in listed.stdout
    assert token not in listed.stdout
    entries = await (await stack.rt.js.key_value("plexus_gateway_tokens")).keys()
    assert token not in " ".join(entries)
    duplicate = await asyncio.to_thread(_tokens, "create", "ci-bot", "--nats", nats_server.url)
    assert duplicate.returncode == 1
    assert "exists" in duplicate.stderr

    revoked = await asyncio.to_thread(_tokens, "revoke", "ci-bot", "--nats", nats_server.url)
    assert revoked.returncode == 0, revoked.stderr
    assert await _until_status(stack.url, token, 401) < 2.0  # no restart needed
    unknown = await asyncio.to_thread(_tokens, "revoke", "ci-bot", "--nats", nats_server.url)
    assert unknown.returncode == 1
    assert "no token named" in unknown.stderr


async def test_a_token_is_scoped_to_its_tenant(tmp_path: Path) -> None:
    """Tenants are NATS accounts: a token minted by acme's operator works on acme's gateway only; each
    gateway runs as its tenant's least-privileged gateway user, with no permissions violation."""
    layout = security_init(tmp_path / "sec", ["acme", "beta"])
    server = NatsServer(store_dir=tmp_path / "nats", extra_config=layout.config.read_text()).start()
    url = f"tls://127.0.0.1:{server.client_port}"
    gateways: list[tuple[Gateway, Runtime]] = []
    try:
        for tenant in ("acme", "beta"):
            operator = await Runtime.connect(url, auth=NatsAuth.from_env(layout.env(tenant, "operator")))
            await operator.close()
            rt = await Runtime.connect(url, auth=NatsAuth.from_env(layout.env(tenant, "gateway")))
            gateway = Gateway(rt, GatewayConfig(token_hashes=frozenset()), port=0)
            await gateway.start()
            gateways.append((gateway, rt))
        created = await asyncio.to_thread(
            _tokens, "create", "acme-ci", "--nats", url, env=layout.env("acme", "operator")
        )
        assert created.returncode == 0, created.stderr
        token = created.stdout.strip()
        (acme, _), (beta, _) = gateways
        await _until_status(acme.url, token, 200)
        assert await _status(beta.url, token) == 401
        # A gateway may follow the tokens but not mint one.
        minted = await asyncio.to_thread(
            _tokens, "create", "forged", "--nats", url, env=layout.env("acme", "gateway")
        )
        assert minted.returncode != 0
        violations = [v for v in server.log_tail(100_000).splitlines() if "Violation" in v]
        assert any("plexus_gateway_tokens" in v for v in violations)  # the forged write, refused
        assert [v for v in violations if "plexus_gateway_tokens" not in v] == []  # nothing else
    finally:
        for gateway, rt in gateways:
            await gateway.stop()
            await rt.close()
        server.cleanup()


async def test_callers_over_the_rate_limit_get_429_with_retry_after(start_gateway: StartGateway) -> None:
    rate, burst = 0.5, 5
    stack = await start_gateway(GatewayConfig(dev=True, rate_limit=rate, burst=burst))
    started = time.monotonic()
    accepted = 0
    while (refused := await stack.client.get("/v1/agents")).status_code == 200 and accepted < 50:
        accepted += 1
    elapsed = time.monotonic() - started
    # The burst, plus what refilled meanwhile (a loaded machine can take seconds for these requests).
    assert burst <= accepted <= burst + int(elapsed * rate) + 1, (accepted, elapsed)
    assert refused.status_code == 429
    assert refused.headers["content-type"].startswith("application/problem+json")
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= 1 / rate + 1
    assert (await stack.client.get("/healthz")).status_code == 200  # probes are never limited
    await asyncio.sleep(retry_after + 0.1)  # as told: one request's worth is back
    assert (await stack.client.get("/v1/agents")).status_code == 200


@pytest.mark.parametrize("origins", [(), ("https://app.example",)])
async def test_cors_is_off_unless_an_origin_is_allowed(
    start_gateway: StartGateway, origins: tuple[str, ...]
) -> None:
    stack = await start_gateway(GatewayConfig(dev=True, cors_origins=origins))
    for origin in ("https://app.example", "https://evil.example"):
        preflight = await stack.client.options(
            "/v1/agents",
            headers={"Origin": origin, "Access-Control-Request-Method": "GET"},
        )
        simple = await stack.client.get("/v1/agents", headers={"Origin": origin})
        allowed = origin in origins
        assert (preflight.headers.get("access-control-allow-origin") == origin) is allowed
        assert (simple.headers.get("access-control-allow-origin") == origin) is allowed


def test_bad_limits_and_origins_are_refused() -> None:
    with pytest.raises(ValueError, match="rate_limit"):
        GatewayConfig(dev=True, rate_limit=-1)
    with pytest.raises(ValueError, match="CORS origin"):
        GatewayConfig(dev=True, cors_origins=("app.example",))
