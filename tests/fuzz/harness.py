"""The fuzz harness: a real nats-server, a `plexus worker` and a `plexus orchestrator` process, a raw nats-py
client that sends fuzzed messages in batches, and liveness rounds through `Runtime` between batches.

It fails (`FuzzFailure`, naming the seed, the batch and the last inputs) on: a process exiting or losing its
NATS connection, a liveness round failing, a message of a hosted type left unacknowledged after the run
quiesces, a traceback in a service log, or a 500-class orchestrator answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from plexus.core import AgentId, MessageId, TextBlock, TopicId
from plexus.runtime import NatsServer, Runtime
from plexus.runtime.kernel import Envelope, Subjects, TypeSubscription, encode_envelope
from plexus.runtime.wire._envelope import WIRE_VERSION, payload_from_blocks

from .mutate import KEYS, VICTIM, Shot, shot

REPO = Path(__file__).resolve().parents[2]
HOSTED_DURABLE = ("echo", "spawner", "listener")
BATCH = 500


class FuzzFailure(AssertionError):
    pass


@dataclass
class Report:
    seed: int
    messages: int
    seconds: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    orchestrator_codes: Counter[str] = field(default_factory=Counter)
    liveness_rounds: int = 0
    max_redelivered: int = 0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.messages / self.seconds if self.seconds else 0.0
        return (
            f"fuzz seed={self.seed}: {self.messages} messages in {self.seconds:.1f}s ({rate:,.0f}/s), "
            f"{self.liveness_rounds} liveness rounds; by target {dict(self.kinds)}; "
            f"orchestrator error codes {dict(self.orchestrator_codes)}; "
            f"most redelivered-and-pending messages on one consumer {self.max_redelivered}"
            + (f"; {len(self.failures)} FAILURES (kept going)" if self.failures else "")
        )


class Harness:
    def __init__(
        self,
        seed: int,
        messages: int,
        workdir: Path,
        keep_going: bool = False,
        fixed: Callable[[Subjects, str], list[Shot]] | None = None,
    ) -> None:
        self.keep_going = keep_going
        self.fixed = fixed  # replay these inputs (built for the run's subjects and reply prefix) instead
        self.log_offsets: dict[str, int] = {}
        self.ready = False  # before, a failed check only means "not yet"
        self.cids: dict[str, set[int]] = {}  # connection name -> the server's client ids, first seen
        self.sent: dict[str, Shot] = {}  # reply subject -> the request it answers (this batch)
        self.seed = seed
        self.messages = messages
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.report = Report(seed, messages)
        self.recent: deque[Shot] = deque(maxlen=20)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.server: NatsServer | None = None
        self.batch = 0

    # -- lifecycle ------------------------------------------------------------------------------------
    def _spawn(self, name: str, *args: str) -> None:
        assert self.server is not None
        log = (self.workdir / f"{name}.log").open("wb")
        cmd = [sys.executable, "-m", "plexus.runtime.cli", *args, "--nats", self.server.url]
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    async def run(self) -> Report:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.server = NatsServer(store_dir=self.workdir / "nats")
        await asyncio.to_thread(self.server.start)
        started = time.monotonic()
        try:
            rt = await Runtime.connect(self.server.url, name="fuzz-liveness")
            try:
                self._spawn("orchestrator", "orchestrator")
                self._spawn("worker", "worker", "tests.fuzz.app:app", "--ack-wait", "5")
                await rt.add_subscription(TypeSubscription(topic_type="fuzz", agent_type="listener"))
                await self._ready(rt)
                self.ready = True
                raw = await nats.connect(self.server.url, name="fuzz", max_reconnect_attempts=-1)
                try:
                    await self._fire(rt, raw)
                finally:
                    await raw.close()
                await self._quiesce(rt)
                await self._fuzzed_keys_serve(rt)
                self._check_processes()
                self._check_connections()
            finally:
                await rt.close()
            self._check_logs()
            if self.report.failures:
                raise FuzzFailure("\n\n".join(self.report.failures))
        finally:
            self.report.seconds = time.monotonic() - started
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    await asyncio.to_thread(proc.wait, 10)
            await asyncio.to_thread(self.server.cleanup)
        return self.report

    async def _ready(self, rt: Runtime) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self._check_processes()
            if all([await rt.workers(t) for t in HOSTED_DURABLE]):
                with contextlib.suppress(Exception):
                    await rt.get_run("run_probe")
                with contextlib.suppress(Exception):
                    await self._liveness(rt)
                    return
            await asyncio.sleep(0.2)
        raise FuzzFailure(f"fuzz seed {self.seed}: the worker and orchestrator did not become ready")

    # -- firing ---------------------------------------------------------------------------------------
    async def _fire(self, rt: Runtime, raw: NATS) -> None:
        inbox = raw.new_inbox()
        answers: list[Msg] = []

        async def collect(msg: Msg) -> None:
            answers.append(msg)

        await raw.subscribe(inbox + ".>", cb=collect)
        js = raw.jetstream()
        sent = 0
        fixed = self.fixed(rt.subjects, inbox) if self.fixed is not None else None
        if fixed is not None:
            self.messages = self.report.messages = len(fixed)
        while sent < self.messages:
            self.batch += 1
            for _ in range(min(BATCH, self.messages - sent)):
                one = fixed[sent] if fixed is not None else shot(self.rng, rt.subjects, f"{inbox}.r{sent}")
                self.recent.append(one)
                self.report.kinds[one.kind] += 1
                self.sent[f"{inbox}.a{sent}"] = one
                await self._send(raw, js, one, f"{inbox}.a{sent}")
                sent += 1
                if one.pause_after:
                    await raw.flush()
                    await asyncio.sleep(one.pause_after)
            await raw.flush()
            await asyncio.sleep(0.3)  # let answers arrive before they are checked
            self._check_answers(answers)
            answers.clear()
            self.sent.clear()
            self._check_logs()
            await self._liveness(rt)

    async def _send(self, raw: NATS, js: Any, one: Shot, reply: str) -> None:
        if len(one.subject) > 3500 or any(c in one.subject for c in " \t\r\n"):
            return  # not sendable by any client: the server would close the *sender's* connection
        try:
            if one.jetstream:
                with contextlib.suppress(Exception):  # refused by the server (bad counter, fenced log): fine
                    await js.publish(one.subject, one.data, headers=one.headers, timeout=5)
            else:
                await raw.publish(
                    one.subject, one.data, reply=reply if one.reply else "", headers=one.headers
                )
        except Exception as exc:
            if raw.is_closed:
                self._fail(f"the fuzz client's own connection closed ({exc!r}): the input is unsendable")

    def _check_answers(self, answers: list[Msg]) -> None:
        for msg in answers:
            code = (msg.headers or {}).get("Nats-Service-Error-Code")
            if code:
                self.report.orchestrator_codes[code] += 1
                if code.startswith("5"):
                    one = self.sent.get(msg.subject)
                    what = one.describe(full=True) if one else "(request not identified)"
                    self._fail(f"orchestrator answered {code}: {msg.data[:300]!r}\n  to: {what}")

    # -- checks ---------------------------------------------------------------------------------------
    async def _liveness(self, rt: Runtime) -> None:
        self._check_processes()
        key = f"live-{self.batch}-{self.rng.randrange(1 << 30)}"
        blocks = [TextBlock(text=f"alive {self.batch}")]
        try:
            async with asyncio.timeout(60):
                assert await rt.send_message(blocks, AgentId("echo", key), timeout=20) == blocks
                assert await rt.send_message(blocks, AgentId("echo-eph", key), timeout=20) == blocks
                assert await rt.publish_message(blocks, TopicId("fuzz", key)) == 1
                run_id = await rt.start_run(AgentId("spawner", key), blocks)
                record = await rt.wait_run(run_id, timeout=30)
                assert record.status == "completed", record
        except Exception as exc:
            self._fail(f"liveness round failed: {exc!r}")
        self.report.liveness_rounds += 1
        self._check_connections()

    def _check_processes(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                self._fail(f"{name} exited with {proc.returncode}")

    def _check_connections(self) -> None:
        """Each service's connection is still there and still the same one: a new client id means it was
        disconnected and reconnected (by default the worker connects as "plexus", the orchestrator as
        "plexus-orchestrator"; the liveness client and the fuzz client have names of their own)."""
        assert self.server is not None
        url = f"http://127.0.0.1:{self.server.monitor_port}/connz?limit=1024"
        with urllib.request.urlopen(url, timeout=5) as resp:
            conns = json.loads(resp.read())["connections"]
        for service, name in (("orchestrator", "plexus-orchestrator"), ("worker", "plexus")):
            cids = {c["cid"] for c in conns if c.get("name") == name}
            if not cids:
                names = Counter(c.get("name", "") for c in conns)
                self._fail(f"the {service}'s connection is gone (connections: {dict(names)})")
            elif self.cids.setdefault(name, cids) != cids:
                self._fail(f"the {service} was disconnected: client ids {self.cids[name]} became {cids}")
                self.cids[name] = cids

    async def _quiesce(self, rt: Runtime) -> None:
        """Every message of a hosted durable type is acked once the run settles (nothing stuck, nothing
        redelivered forever)."""
        deadline = time.monotonic() + 60
        stuck: dict[str, tuple[int, int]] = {}
        while time.monotonic() < deadline:
            stuck = {}
            async for info in _consumers(rt):
                name = info.name or ""
                hosted = any(f"__{t}__" in name for t in HOSTED_DURABLE)
                if hosted and (info.num_pending or info.num_ack_pending):
                    stuck[name] = (info.num_pending, info.num_ack_pending)
                if hosted:
                    self.report.max_redelivered = max(self.report.max_redelivered, info.num_redelivered or 0)
            if not stuck:
                return
            await asyncio.sleep(1)
        self._fail(f"messages never acked (consumer: pending, ack pending): {stuck}")

    async def _fuzzed_keys_serve(self, rt: Runtime) -> None:
        """The agents the fuzz aimed at still answer (none wedged by a junk EventLog entry, a forged
        reply, a fenced commit, ...), and a durable one answers three messages in the order they were stored
        (per-key order)."""
        for key in KEYS:
            await self._in_order(rt, key)
        blocks = [TextBlock(text="still serving")]
        for agent_type in ("echo-eph",):
            for key in KEYS:
                try:
                    async with asyncio.timeout(30):
                        got = await rt.send_message(blocks, AgentId(agent_type, key), timeout=20)
                    assert got == blocks, got
                except Exception as exc:
                    self._fail(f"fuzzed agent {agent_type}/{key} no longer answers: {exc!r}")
        try:  # only the worker writes here (replies aimed at it must have been refused)
            await rt.event_log(AgentId("echo", VICTIM)).read()
        except Exception as exc:
            self._fail(f"the EventLog of echo/{VICTIM} no longer reads: {exc!r}")

    async def _in_order(self, rt: Runtime, key: str) -> None:
        """Three envelopes to `echo/<key>`, stored in order (each PubAck awaited); the worker replies after
        each commit, from one connection, so the replies arrive in handling order."""
        inbox = rt.nc.new_inbox()
        replies: list[str] = []
        done = asyncio.Event()

        async def collect(msg: Msg) -> None:
            replies.append(msg.subject.rsplit(".", 1)[1])
            if len(replies) == 3:
                done.set()

        sub = await rt.nc.subscribe(inbox + ".>", cb=collect)
        try:
            for tag in "ABC":
                env = Envelope(
                    id=str(MessageId.new()),
                    kind="send",
                    target=f"echo/{key}",
                    reply_to=f"{inbox}.{tag}",
                    payload=payload_from_blocks([TextBlock(text=tag)]),
                    sent_at=time.time(),
                )
                headers = {"Nats-Msg-Id": env.id, "Plexus-V": str(WIRE_VERSION)}
                await rt.js.publish(rt.subjects.inbox("echo", key), encode_envelope(env), headers=headers)
            try:
                async with asyncio.timeout(60):
                    await done.wait()
            except TimeoutError:
                self._fail(f"fuzzed agent echo/{key} no longer answers (replies: {replies})")
                return
            if replies != ["A", "B", "C"]:
                self._fail(f"per-key order broken on echo/{key}: stored A, B, C; handled {replies}")
        finally:
            await sub.unsubscribe()

    def _check_logs(self) -> None:
        """A traceback in a service log fails the run; logs are read incrementally so the batch is known."""
        for name in self.procs:
            path = self.workdir / f"{name}.log"
            with path.open("rb") as f:
                f.seek(self.log_offsets.get(name, 0))
                chunk = f.read()
            # Only complete lines: a traceback half-written now is read whole next time.
            end = chunk.rfind(b"\n") + 1
            self.log_offsets[name] = self.log_offsets.get(name, 0) + end
            text = chunk[:end].decode(errors="replace")
            if "Traceback" in text:
                at = text.index("Traceback")
                self._fail(f"a traceback in the {name} log:\n{text[max(at - 300, 0) : at + 2500]}")

    def _fail(self, what: str) -> None:
        last = "\n  ".join(s.describe() for s in list(self.recent)[-5:])
        text = (
            f"fuzz seed {self.seed}, batch {self.batch}: {what}\n  last inputs:\n  {last}\n"
            f"  replay: python -m tests.fuzz --seed {self.seed} --messages {self.messages}"
        )
        if self.keep_going and self.ready and not any(p.poll() is not None for p in self.procs.values()):
            print(f"fuzz: FAILURE (keeping going)\n{text}\n", file=sys.stderr, flush=True)
            self.report.failures.append(text)
            return
        raise FuzzFailure(text)


async def _consumers(rt: Runtime) -> Any:
    stream = rt.topology.names.inbox_stream
    for info in await rt.js.consumers_info(stream):
        yield info


async def fuzz(seed: int, messages: int, workdir: Path, keep_going: bool = False) -> Report:
    """Run the harness once; raises `FuzzFailure` on the first failure (on all of them, at the end,
    with `keep_going`)."""
    return await Harness(seed, messages, workdir, keep_going).run()


async def replay(
    inputs: Callable[[Subjects, str], list[Shot]], workdir: Path, keep_going: bool = False
) -> Report:
    """Send fixed inputs (`found.found_inputs`) in one batch, then run every check of a fuzz run."""
    return await Harness(0, 0, workdir, keep_going, fixed=inputs).run()
