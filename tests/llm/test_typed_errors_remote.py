"""Issue 36 item 10, end to end: a client process that never imported plexus.llm gets an LLMAgent's provider
error as its class (`AuthenticationError`), not as a `RemoteKernelError`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import openai

from plexus.llm import LLMAgent, OpenAIChatModel
from plexus.runtime import App, NatsServer
from tests.runtime.conftest import REPO
from tests.security.seeds import identity_env

from .fake_providers import FakeProvider, Status

_CLIENT = """
import asyncio, json, sys
from plexus.core import AgentId, KernelError, TextBlock
from plexus.runtime import Runtime

async def main() -> None:
    rt = await Runtime.connect(sys.argv[1])
    before = "plexus.llm" in sys.modules
    try:
        await rt.send_message([TextBlock(text="hi")], AgentId("keyless", "1"), timeout=60)
        got = None
    except KernelError as exc:
        got = [type(exc).__module__, type(exc).__name__, exc.field_values()]
    finally:
        await rt.close()
    print(json.dumps({"llm_imported_before": before, "error": got}))

asyncio.run(main())
"""


async def test_a_client_that_never_imported_plexus_llm_gets_the_provider_error_class(
    nats_server: NatsServer, start_worker: Any
) -> None:
    async with FakeProvider(lambda _: Status(401, {"error": {"message": "bad key"}})) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k")
        app = App()
        app.register("keyless", lambda _id: LLMAgent(OpenAIChatModel(client, "m")))
        await start_worker(app)
        env = {**os.environ, "PYTHONPATH": str(REPO), **identity_env(nats_server, "client")}
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", _CLIENT, nats_server.url],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["llm_imported_before"] is False
    module, name, fields = result["error"]
    assert (module, name) == ("plexus.llm._errors", "AuthenticationError")
    assert (fields["provider"], fields["status"]) == ("openai", 401)
