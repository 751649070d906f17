"""Every `plexus` command loads the gateway's subcommands; only `plexus gateway` loads the web stack (FastAPI,
uvicorn, sse-starlette: ≈ 0.45 s of start-up a worker or `plexus runs ls` would pay for nothing)."""

from __future__ import annotations

from tests.imports import modules_after

WEB = ("fastapi", "uvicorn", "sse_starlette")


def test_building_the_cli_with_every_plugin_imports_no_web_stack() -> None:
    code = "import plexus.runtime.cli as cli\nassert 'gateway' in cli.build_parser().format_help()"
    assert modules_after(code, WEB) == dict.fromkeys(WEB, False)


def test_the_gateway_facade_still_gives_the_server_and_the_app() -> None:
    code = "from plexus.gateway import Gateway, create_app\nassert Gateway.__name__ == 'Gateway', create_app"
    assert modules_after(code, WEB) == dict.fromkeys(WEB, True)
