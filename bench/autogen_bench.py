"""AutoGen's gRPC distributed runtime (autogen-core / autogen-ext[grpc] 0.7.5) under the same ping-pong load.

Runs ONLY with the interpreter of the isolated venv that `bench/run.py` creates in ``.bench-venv/autogen``
(AutoGen is never a dependency of Plexus). Three processes, as AutoGen deploys: ``host`` (the gRPC relay),
``worker`` (hosts the ``echo`` agent type) and ``client`` (a worker runtime with no agents that sends).
"""

import asyncio
from dataclasses import dataclass
from typing import Any

from autogen_core import (  # type: ignore[import-not-found]
    AgentId,
    MessageContext,
    RoutedAgent,
    message_handler,
    try_get_known_serializers_for_type,
)
from autogen_ext.runtimes.grpc import (  # type: ignore[import-not-found]
    GrpcWorkerAgentRuntime,
    GrpcWorkerAgentRuntimeHost,
)

from bench.common import PAYLOAD, Results, client_args, measure_rr, ready, run, sizes_for


@dataclass
class Ping:
    text: str


class EchoAgent(RoutedAgent):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__("echo")

    @message_handler  # type: ignore[untyped-decorator]
    async def on_ping(self, message: Ping, ctx: MessageContext) -> Ping:
        return Ping(text=message.text)


async def host(address: str) -> None:
    server = GrpcWorkerAgentRuntimeHost(address=address)
    server.start()
    await asyncio.sleep(0.5)  # the host has no readiness signal; the worker retries its connect anyway
    ready()
    await server.stop_when_signal()


async def runtime(address: str) -> Any:
    rt = GrpcWorkerAgentRuntime(host_address=address)
    rt.add_message_serializer(try_get_known_serializers_for_type(Ping))
    for attempt in range(50):  # the host may still be binding its port
        try:
            await rt.start()
            return rt
        except Exception:
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)
            rt = GrpcWorkerAgentRuntime(host_address=address)
            rt.add_message_serializer(try_get_known_serializers_for_type(Ping))
    return rt


async def worker(address: str) -> None:
    rt = await runtime(address)
    await EchoAgent.register(rt, "echo", lambda: EchoAgent())
    ready()
    await rt.stop_when_signal()


async def client(address: str, mode: str) -> None:
    sizes = sizes_for(mode)
    rt = await runtime(address)
    results = Results(info={"payload_bytes": len(PAYLOAD)})
    ids = [AgentId("echo", f"lane{n}") for n in range(100)]
    message = Ping(text=PAYLOAD)

    async def call(lane: int, i: int) -> None:
        # AutoGen has no per-call timeout; the bench's own process deadline covers a hang.
        reply = await rt.send_message(message, ids[lane])
        if not isinstance(reply, Ping):
            raise RuntimeError(f"unexpected AutoGen reply {reply!r}")

    await measure_rr(results, "autogen.rr", sizes, call)
    results.info["autogen"] = "autogen-core 0.7.5, autogen-ext[grpc] 0.7.5"
    results.emit()
    await rt.stop()


def main() -> None:
    args = client_args(__doc__ or "")
    if args.role == "host":
        run(lambda: host(args.url), "asyncio")
    elif args.role == "worker":
        run(lambda: worker(args.url), "asyncio")
    else:
        run(lambda: client(args.url, args.mode), "asyncio")


if __name__ == "__main__":
    main()
