"""The A2A routes of the gateway: per exposed agent type, its agent card and its JSON-RPC endpoint.

Layout: ``/a2a/{type}`` is an agent's base URL and JSON-RPC endpoint, and its card is at the well-known
path under it, ``/a2a/{type}/.well-known/agent-card.json``, where A2A clients given that base URL look
for it. The card is public (a client reads it to learn how to authenticate); the endpoint takes the same
bearer tokens and rate limit as ``/v1``. An agent type that is not exposed is a 404 on both, the same as
one that does not exist. The routes are JSON-RPC, not REST, so they are left out of the OpenAPI document.
"""

from __future__ import annotations

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route

from plexus.runtime.kernel import AgentTypeInfo

from ._a2a import A2AHandler
from ._problems import Problem
from ._state import GatewayState, authorize, state

__all__ = ["BEARER", "agent_card", "install_a2a"]

#: The security scheme name the cards declare (the gateway's bearer tokens).
BEARER = "bearer"
_MODES = ["text/plain", "application/json"]


def agent_card(info: AgentTypeInfo, url: str) -> AgentCard:
    """The card of one agent type from its registry entry: each capability is a skill."""
    description = info.description or f"the Plexus agent type {info.type!r}"
    card = AgentCard(
        name=info.type,
        description=description,
        version=str(info.version),
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=_MODES,
        default_output_modes=_MODES,
    )
    card.supported_interfaces.append(
        AgentInterface(
            url=url,
            protocol_binding=TransportProtocol.JSONRPC.value,
            protocol_version=PROTOCOL_VERSION_CURRENT,
        )
    )
    card.security_schemes[BEARER].CopyFrom(
        SecurityScheme(
            http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="Bearer", description="a Plexus gateway token (`plexus gateway tokens create`)"
            )
        )
    )
    requirement = SecurityRequirement()
    requirement.schemes[BEARER].CopyFrom(StringList())
    card.security_requirements.append(requirement)
    skills = list(info.capabilities) or [info.type]
    for skill in skills:
        card.skills.append(AgentSkill(id=skill, name=skill, description=description, tags=[skill]))
    return card


def install_a2a(app: FastAPI, gw: GatewayState) -> None:
    """Mount the A2A routes for ``gw.config.a2a_types`` (none: nothing is mounted)."""
    exposed = frozenset(gw.config.a2a_types)
    if not exposed:
        return
    endpoints = {}
    for agent_type in exposed:
        handler = A2AHandler(gw.rt, agent_type, wait_s=gw.config.max_rpc_timeout_s)
        # The SDK's JSON-RPC dispatcher, 1.0 method names and the 0.3 ones (`message/send`, ...).
        route = create_jsonrpc_routes(handler, f"/a2a/{agent_type}", enable_v0_3_compat=True)[0]
        assert isinstance(route, Route)
        endpoints[agent_type] = route.endpoint

    async def info(gw: GatewayState, agent_type: str) -> AgentTypeInfo:
        if agent_type in exposed:
            for t in await gw.rt.agent_types(gw.rt.namespace):
                if t.type == agent_type:
                    return t
        raise Problem(404, "Not found", f"no A2A agent {agent_type!r} here")

    router = APIRouter(prefix="/a2a", include_in_schema=False)

    @router.get("/{agent_type}/.well-known/agent-card.json")
    async def card(agent_type: str, request: Request) -> JSONResponse:
        gw = state(request)
        found = await info(gw, agent_type)
        url = str(request.url_for("a2a_rpc", agent_type=agent_type))
        return JSONResponse(agent_card_to_dict(agent_card(found, url)))

    @router.post("/{agent_type}", name="a2a_rpc", dependencies=[Depends(authorize)])
    async def rpc(agent_type: str, request: Request) -> Response:
        endpoint = endpoints.get(agent_type)
        if endpoint is None:
            raise Problem(404, "Not found", f"no A2A agent {agent_type!r} here")
        response: Response = await endpoint(request)
        return response

    app.include_router(router)
