"""Turn per-repeat metrics into the table, the target verdicts, `latest.json` and the docs section.

Every ratio is computed from medians measured in the same run (never against stored numbers).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import summarise

DOCS_START = "<!-- bench:latest:start -->"
DOCS_END = "<!-- bench:latest:end -->"

Summary = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Row:
    label: str
    unit: str
    raw: str | None
    plexus: str | None
    autogen: str | None
    #: Ratios are shown only for throughput rows (higher is better); latency and memory rows show values.
    ratios: bool = True


ROWS = (
    Row("request/reply, 1 in flight", "msg/s", "raw.rr.1", "plexus.eph.1", "autogen.rr.1"),
    Row("request/reply, 10 in flight", "msg/s", "raw.rr.10", "plexus.eph.10", "autogen.rr.10"),
    Row("request/reply, 100 in flight", "msg/s", "raw.rr.100", "plexus.eph.100", "autogen.rr.100"),
    Row(
        "request/reply p50, 1 in flight", "ms", "raw.rr.1.p50", "plexus.eph.1.p50", "autogen.rr.1.p50", False
    ),
    Row("durable send, 1 in flight", "msg/s", "raw.js.1", "plexus.dur.1", "autogen.rr.1"),
    Row("durable send, 100 in flight", "msg/s", "raw.js.100", "plexus.dur.100", "autogen.rr.100"),
    Row("durable p50, 1 in flight", "ms", "raw.js.1.p50", "plexus.dur.1.p50", None, False),
    Row("publish fan-out to 10 subscribers", "pub/s", "raw.fanout", "plexus.fanout", None),
    Row("durable, 10 keys, 100 in flight", "msg/s", None, "plexus.keys.10", None, False),
    Row("durable, distinct keys, 100 in flight", "msg/s", None, "plexus.keys.many", None, False),
    Row("distinct keys / 10 keys throughput", "×", None, "plexus.keys.ratio", None, False),
    Row("RSS per idle activation", "B", None, "plexus.mem.per_activation", None, False),
    Row("RSS at peak (all activations live)", "MB", None, "plexus.mem.peak", None, False),
    Row("RSS after passivating all", "MB", None, "plexus.mem.after_passivation", None, False),
    Row(
        "RSS after passivating all ÷ RSS before the run",
        "×",
        None,
        "plexus.mem.after_passivation_ratio",
        None,
        False,
    ),
    Row("… and 5 s later (idle)", "MB", None, "plexus.mem.idle_after_passivation", None, False),
    Row("… ÷ RSS before the run", "×", None, "plexus.mem.idle_after_passivation_ratio", None, False),
    # The same worker on jemalloc (`plexus worker --allocator jemalloc`, as deploy/Dockerfile runs it).
    Row("jemalloc worker: durable, distinct keys", "msg/s", None, "plexus.keys.jemalloc.many", None, False),
    Row("jemalloc worker: RSS at peak", "MB", None, "plexus.mem.jemalloc.peak", None, False),
    Row(
        "jemalloc worker: RSS after passivating all",
        "MB",
        None,
        "plexus.mem.jemalloc.after_passivation",
        None,
        False,
    ),
    Row(
        "jemalloc worker: … and 5 s later (idle)",
        "MB",
        None,
        "plexus.mem.jemalloc.idle_after_passivation",
        None,
        False,
    ),
    Row(
        "jemalloc worker: … ÷ RSS before the run",
        "×",
        None,
        "plexus.mem.jemalloc.idle_after_passivation_ratio",
        None,
        False,
    ),
    *(
        Row(
            f"budget consume (cluster, JetStream counter) {q}",
            "µs",
            None,
            f"plexus.consume.cluster.{q}",
            None,
            False,
        )
        for q in ("p50", "p99")
    ),
    *(
        Row(f"budget consume (process-local) {q}", "µs", None, f"plexus.consume.{q}", None, False)
        for q in ("p50", "p99")
    ),
    Row("progress worker → subscriber p50", "ms", None, "plexus.progress.p50", None, False),
    Row("progress worker → subscriber p99", "ms", None, "plexus.progress.p99", None, False),
    # bench/llm_bench.py: (run of 2 turns + 1 tool - 2 bare SDK calls) / 2, against a fake OpenAI provider,
    # p50 over rounds that measure both sides back to back.
    Row("LLM bare SDK call p50 (the baseline)", "ms", None, "llm.bare_call.p50_ms", None, False),
    Row("LLM loop overhead per model turn p50", "ms", None, "llm.overhead_per_turn.p50_ms", None, False),
    # The raw column: the same durable work hand-written on nats-py and the SDK (bench/llm_floor.py).
    Row(
        "LLM loop overhead per model turn, inside the handler p50",
        "ms",
        "llm.floor.loop_overhead_per_turn.p50_ms",
        "llm.loop_overhead_per_turn.p50_ms",
        None,
        False,
    ),
    Row(
        "LLM loop overhead per model turn, inside the handler ÷ the hand-written floor's",
        "×",
        None,
        "llm.loop_overhead_floor_ratio",
        None,
        False,
    ),
    Row(
        "LLM loop overhead per model turn, inside the handler ÷ one bare SDK call",
        "×",
        None,
        "llm.loop_overhead_ratio",
        None,
        False,
    ),
    Row("LLM loop CPU per model turn", "ms", None, "llm.cpu_per_turn_ms", None, False),
    Row(
        "LLM bench null control (bare pair after the run − before, per call) p50",
        "ms",
        None,
        "llm.null_control_per_call.p50_ms",
        None,
        False,
    ),
    Row(
        "LLM loop overhead per model turn, orchestrated run p50",
        "ms",
        None,
        "llm.orchestrated.overhead_per_turn.p50_ms",
        None,
        False,
    ),
    Row(
        "LLM loop overhead per model turn, orchestrated, inside the handler p50",
        "ms",
        "llm.orchestrated.floor.loop_overhead_per_turn.p50_ms",
        "llm.orchestrated.loop_overhead_per_turn.p50_ms",
        None,
        False,
    ),
    Row(
        "LLM loop overhead per model turn, orchestrated, inside the handler ÷ the hand-written floor's",
        "×",
        None,
        "llm.orchestrated.loop_overhead_floor_ratio",
        None,
        False,
    ),
    # bench/llm_bench.py: the same plain rounds over the Responses API adapter (a reasoning item sent back).
    Row("LLM bare SDK call, Responses API p50", "ms", None, "llm.responses.bare_call.p50_ms", None, False),
    Row(
        "LLM loop overhead per model turn, Responses API, inside the handler p50",
        "ms",
        None,
        "llm.responses.loop_overhead_per_turn.p50_ms",
        None,
        False,
    ),
    # bench/mcp_bench.py: one MCP tool call (stdio server) in the loop against the bare mcp client, in rounds.
    Row("MCP tool call, bare mcp client p50", "ms", None, "mcp.bare_call.p50_ms", None, False),
    Row("MCP tool call inside the LLM loop p50", "ms", None, "mcp.loop_call.p50_ms", None, False),
    Row("MCP tool call, the loop's overhead p50", "ms", None, "mcp.overhead_per_call.p50_ms", None, False),
    # bench/peer_bench.py: LLM-loop peers measured the same way (same fake, same rounds, same run).
    *(
        row
        for peer, key in (
            ("OpenAI Agents SDK", "agents"),
            ("pydantic-ai", "pydantic_ai"),
            ("LangGraph", "langgraph"),
        )
        for row in (
            Row(
                f"peer: {peer} loop overhead per model turn p50 (streamed, in-process)",
                "ms",
                None,
                f"peer.{key}.loop_overhead_per_turn.p50_ms",
                None,
                False,
            ),
            Row(
                f"peer: {peer} loop overhead per model turn ÷ one bare SDK call",
                "×",
                None,
                f"peer.{key}.loop_overhead_ratio",
                None,
                False,
            ),
        )
    ),
    # bench/scale_bench.py: a durable type whose handler awaits 50 ms, 4 handlers at once per worker process.
    *(
        Row(f"scale-out, {n} worker(s) (50 ms handler)", "msg/s", None, f"scale.{n}", None, False)
        for n in (1, 2, 4)
    ),
    *(
        Row(f"scale-out throughput {n} workers / 1", "×", None, f"scale.ratio.{n}", None, False)
        for n in (2, 4)
    ),
    Row("rebalance: a worker joins", "s", None, "rebalance.join", None, False),
    Row("rebalance: a worker leaves (graceful)", "s", None, "rebalance.leave", None, False),
    Row("rebalance: a worker is killed (lease TTL 10 s)", "s", None, "rebalance.crash", None, False),
    # bench/sse_bench.py: the gateway's SSE path (plexus gateway --dev as its own process).
    Row("progress worker → SSE client p50", "ms", None, "sse.latency.p50", None, False),
    Row("progress worker → SSE client p99", "ms", None, "sse.latency.p99", None, False),
    Row("SSE fan-out to many clients on one tree", "events/s", None, "sse.fanout.events_per_s", None, False),
    Row("gateway CPU per delivered SSE event", "µs", None, "sse.fanout.cpu_per_event", None, False),
    # bench/durability_bench.py: durable sends, default lazy fsync vs `sync_interval: always`, R1 and R3.
    *(
        Row(
            f"durable send R{r}, {sync} fsync, {n} in flight",
            "msg/s",
            None,
            f"durability.r{r}.{sync}.{n}",
            None,
            False,
        )
        for r in (1, 3)
        for sync in ("default", "always")
        for n in (1, 16)
    ),
    *(
        Row(
            f"sync_interval always / default, R{r}, {n} in flight",
            "×",
            None,
            f"durability.ratio.r{r}.{n}",
            None,
            False,
        )
        for r in (1, 3)
        for n in (1, 16)
    ),
    # bench/timers_bench.py: one-shot timers (ctx.schedule_message) due together, due time -> the target's
    # handler; then timers pending for a day (full: 10,000 within a minute and 100,000; quick: 500 within a
    # second and 5,000).
    Row("timer fire delay p50 (10,000 due within 1 min)", "ms", None, "timers.fire.p50", None, False),
    Row("timer fire delay p99 (10,000 due within 1 min)", "ms", None, "timers.fire.p99", None, False),
    Row("timers set from handlers (100 per commit)", "timers/s", None, "timers.fire.set_rate", None, False),
    Row(
        "pending timers: PLEXUS_SCHEDULES per timer",
        "B",
        None,
        "timers.pending.stream_per_timer",
        None,
        False,
    ),
    Row(
        "pending timers: nats-server memory (/varz) per timer",
        "B",
        None,
        "timers.pending.server_mem_per_timer",
        None,
        False,
    ),
    Row(
        "pending timers (100,000): nats-server memory growth",
        "MB",
        None,
        "timers.pending.server_mem_mb",
        None,
        False,
    ),
    Row(
        "pending timers (100,000): worker RSS growth", "MB", None, "timers.pending.worker_rss_mb", None, False
    ),
)


@dataclass(frozen=True)
class Target:
    text: str
    value: Callable[[Summary], float | None]
    threshold: float
    at_most: bool = False

    def evaluate(self, summary: Summary) -> dict[str, Any]:
        value = self.value(summary)
        if value is None or math.isnan(value):
            return {"target": self.text, "value": None, "holds": None}
        holds = value <= self.threshold if self.at_most else value >= self.threshold
        return {"target": self.text, "value": value, "holds": holds}


def median(summary: Summary, name: str) -> float | None:
    entry = summary.get(name)
    return None if entry is None else float(entry["median"])


def ratio(summary: Summary, top: str, bottom: str) -> float | None:
    a, b = median(summary, top), median(summary, bottom)
    return None if a is None or b is None or b == 0 else a / b


def _ratio(top: str, bottom: str) -> Callable[[Summary], float | None]:
    return lambda s: ratio(s, top, bottom)


def _median(name: str) -> Callable[[Summary], float | None]:
    return lambda s: median(s, name)


TARGETS = (
    *(
        Target(
            f"ephemeral ≥ 0.8× raw request/reply ({n} in flight)",
            _ratio(f"plexus.eph.{n}", f"raw.rr.{n}"),
            0.8,
        )
        for n in (1, 10, 100)
    ),
    *(
        Target(
            f"durable ≥ 0.6× raw JetStream round trip ({n} in flight)",
            _ratio(f"plexus.dur.{n}", f"raw.js.{n}"),
            0.6,
        )
        for n in (1, 100)
    ),
    *(
        Target(f"ephemeral ≥ 5× AutoGen ({n} in flight)", _ratio(f"plexus.eph.{n}", f"autogen.rr.{n}"), 5.0)
        for n in (1, 10, 100)
    ),
    # Issue 12's steps on the way to the goals above.
    *(
        Target(
            f"issue 12: ephemeral ≥ 0.5× raw request/reply ({n} in flight)",
            _ratio(f"plexus.eph.{n}", f"raw.rr.{n}"),
            0.5,
        )
        for n in (1, 10, 100)
    ),
    Target(
        "issue 12: durable ≥ 0.4× raw JetStream round trip (100 in flight)",
        _ratio("plexus.dur.100", "raw.js.100"),
        0.4,
    ),
    Target("issue 12: durable ≥ 2× AutoGen (100 in flight)", _ratio("plexus.dur.100", "autogen.rr.100"), 2.0),
    # Issue 42, item 5: the next step for request/reply (its fan-out and durable steps are issue 12's rows).
    Target(
        "issue 42: ephemeral ≥ 0.6× raw request/reply (100 in flight)",
        _ratio("plexus.eph.100", "raw.rr.100"),
        0.6,
    ),
    Target("fan-out ≥ 0.8× raw", _ratio("plexus.fanout", "raw.fanout"), 0.8),
    Target("issue 12: fan-out ≥ 0.5× raw", _ratio("plexus.fanout", "raw.fanout"), 0.5),
    Target("distinct keys ≥ 0.9× the 10-key throughput", _median("plexus.keys.ratio"), 0.9),
    *(Target(f"scale-out ≥ 0.9 × {n} ({n} workers)", _median(f"scale.ratio.{n}"), 0.9 * n) for n in (2, 4)),
    Target("≤ 4 KB (4096 B) per idle activation", _median("plexus.mem.per_activation"), 4096.0, at_most=True),
    # Issue 42: memory comes back once every activation is passivated. On CPython's allocator it cannot
    # (docs/benchmarks.md); the deployed worker runs on jemalloc; the target is read 5 s after the round.
    Target(
        "RSS after passivating all ≤ 1.5× the worker's RSS before the run (jemalloc worker, 5 s idle)",
        _median("plexus.mem.jemalloc.idle_after_passivation_ratio"),
        1.5,
        at_most=True,
    ),
    Target("progress worker → SSE client p50 ≤ 5 ms", _median("sse.latency.p50"), 5.0, at_most=True),
    Target(
        "LLM loop overhead per model turn ≤ 1 ms (whole run)",
        _median("llm.overhead_per_turn.p50_ms"),
        1.0,
        at_most=True,
    ),
    Target(
        "LLM loop overhead per model turn ≤ 1 ms (inside the handler)",
        _median("llm.loop_overhead_per_turn.p50_ms"),
        1.0,
        at_most=True,
    ),
    Target(
        "LLM loop overhead per model turn ≤ ⅓ of a bare SDK call (inside the handler; 1 ms at a 3 ms call)",
        _median("llm.loop_overhead_ratio"),
        1 / 3,
        at_most=True,
    ),
    Target(
        "LLM loop overhead per model turn ≤ 1 ms (orchestrated, inside the handler)",
        _median("llm.orchestrated.loop_overhead_per_turn.p50_ms"),
        1.0,
        at_most=True,
    ),
    # Issue 37: one MCP tool call inside the loop against the same call on a bare mcp session (same run).
    Target(
        "MCP tool call inside the LLM loop p50 ≤ 1.2× the bare mcp client's",
        _ratio("mcp.loop_call.p50_ms", "mcp.bare_call.p50_ms"),
        1.2,
        at_most=True,
    ),
)


def summary_of(metrics: dict[str, dict[str, Any]]) -> Summary:
    return {
        name: {"unit": entry["unit"], "values": entry["values"], **summarise(entry["values"])}
        for name, entry in metrics.items()
        if entry["values"]
    }


def _num(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def cell(summary: Summary, name: str | None, missing: str) -> str:
    if name is None:
        return ""
    entry = summary.get(name)
    if entry is None:
        return missing
    return f"{_num(entry['median'])} [{_num(entry['min'])}–{_num(entry['max'])}]"


def _ratio_cell(summary: Summary, top: str | None, bottom: str | None) -> str:
    if top is None or bottom is None:
        return ""
    value = ratio(summary, top, bottom)
    return "" if value is None else f"{value:.2f}×"


def table_rows(
    summary: Summary, missing: dict[str, str], distinct_keys: int | None = None
) -> list[list[str]]:
    rows = []
    for row in ROWS:
        label = row.label
        if distinct_keys is not None:
            label = label.replace("distinct keys", f"{distinct_keys:,} distinct keys")
        system_missing = {k: missing.get(k, "n/a") for k in ("raw", "plexus", "autogen")}
        rows.append(
            [
                f"{label} ({row.unit})",
                cell(summary, row.raw, system_missing["raw"]),
                cell(summary, row.plexus, system_missing["plexus"]),
                cell(summary, row.autogen, system_missing["autogen"]),
                _ratio_cell(summary, row.plexus, row.raw) if row.ratios else "",
                _ratio_cell(summary, row.plexus, row.autogen) if row.ratios else "",
            ]
        )
    return rows


HEADER = [
    "scenario (median [min–max])",
    "raw nats-py",
    "Plexus",
    "AutoGen gRPC",
    "Plexus/raw",
    "Plexus/AutoGen",
]


def render_text(rows: list[list[str]], verdicts: list[dict[str, Any]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.append("")
    lines.append("targets (reported, never asserted):")
    lines += [f"  {_verdict(v):<6} {v['target']}: {_value(v)}" for v in verdicts]
    return "\n".join(lines)


def render_markdown(rows: list[list[str]], verdicts: list[dict[str, Any]], heading: str) -> str:
    lines = [heading, "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    lines += ["", "| target | measured | holds |", "|---|---|---|"]
    lines += [f"| {v['target']} | {_value(v)} | {_verdict(v)} |" for v in verdicts]
    return "\n".join(lines)


def _verdict(v: dict[str, Any]) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[v["holds"]]


def _value(v: dict[str, Any]) -> str:
    value = v["value"]
    if value is None:
        return "n/a"
    if "KB" in v["target"]:
        return f"{value:,.0f} B"
    if v["target"].endswith(" ms") or " ms (" in v["target"]:  # a latency target: milliseconds, not a ratio
        return f"{value:.2f} ms"
    return f"{value:.2f}×"


def update_docs(path: Path, markdown: str) -> bool:
    """Replace the section between the markers in docs/benchmarks.md; False when the markers are missing."""
    if not path.exists():
        return False
    text = path.read_text()
    pattern = re.compile(re.escape(DOCS_START) + r".*?" + re.escape(DOCS_END), re.S)
    if not pattern.search(text):
        return False
    replacement = f"{DOCS_START}\n{markdown}\n{DOCS_END}"
    path.write_text(pattern.sub(lambda _m: replacement, text))
    return True
