"""`make bench` judges issue 37's MCP goal: one MCP tool call inside the loop within 1.2× the bare call."""

from __future__ import annotations

from bench.report import TARGETS, summary_of


def _verdict(bare_ms: float, loop_ms: float) -> dict[str, object]:
    metrics = {
        "mcp.bare_call.p50_ms": {"unit": "ms", "values": [bare_ms]},
        "mcp.loop_call.p50_ms": {"unit": "ms", "values": [loop_ms]},
    }
    summary = summary_of(metrics)
    [target] = [t for t in TARGETS if t.text.startswith("MCP tool call inside the LLM loop")]
    return target.evaluate(summary)


def test_the_mcp_target_holds_at_most_one_point_two_times_the_bare_call() -> None:
    assert _verdict(1.0, 1.15)["holds"] is True
    held = _verdict(1.0, 1.3)
    assert held["holds"] is False
    assert held["value"] == 1.3
