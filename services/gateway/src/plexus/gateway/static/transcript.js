// The transcript view: an LLM agent's turns in a run (GET /v1/runs/{id}/transcript), "fork from here" on any
// turn (POST /v1/runs/{id}/fork) and a fork side by side with its source. Live: it reads the transcript again
// when the run tree's SSE stream says something happened (no polling). Uses app.js's api(), text() and token.
"use strict";

const FORK_KEY = "plexus.llm.fork";
const HANDOFF_KEY = "plexus.llm.handoff";
const tx = { runId: null, agent: null, sourceOf: null, events: null, timer: null, forkTurn: null };

function selectedRunId() {
  return new URLSearchParams(location.hash.slice(1)).get("node");
}

// The detail pane's title changes whenever a node is selected (app.js redraws it): offer the view then.
new MutationObserver(() => {
  $("d-transcript").hidden = !selectedRunId() || $("d-title").textContent === "Select a node";
}).observe($("d-title"), { childList: true, characterData: true, subtree: true });

$("d-transcript").onclick = () => openTranscript(selectedRunId(), null);
$("tx-close").onclick = closeTranscript;
$("tx-compare").onclick = () => compareWithSource();
$("tx-fork-cancel").onclick = () => { $("tx-editor").hidden = true; };
$("tx-fork-go").onclick = () => forkHere();

async function openTranscript(runId, agent) {
  tx.runId = runId;
  tx.agent = agent;
  tx.sourceOf = null;
  $("transcript-pane").hidden = false;
  $("tx-source").hidden = true;
  $("tx-editor").hidden = true;
  await refresh();
  follow(runId);
}

function closeTranscript() {
  $("transcript-pane").hidden = true;
  if (tx.events) tx.events.close();
  tx.events = null;
  tx.runId = null;
}

function transcriptUrl(runId, agent) {
  const q = agent ? `?agent=${encodeURIComponent(agent)}` : "";
  return `/v1/runs/${encodeURIComponent(runId)}/transcript${q}`;
}

async function refresh() {
  if (!tx.runId) return;
  try {
    const main = await api(transcriptUrl(tx.runId, tx.agent));
    renderTranscript($("tx-main"), main, true);
    $("tx-title").textContent = `Transcript of ${main.agent_id}`;
    $("tx-compare").hidden = !main.forked_from;
    if (tx.sourceOf) {
      const f = tx.sourceOf;
      renderTranscript($("tx-source"), await api(transcriptUrl(f.run_id, f.agent_id)), false, f);
    }
  } catch (err) {
    $("tx-main").replaceChildren(text("p", `transcript unavailable: ${err.message}`, "tx-error"));
  }
}

// The run tree's events (its root's stream) trigger a new read, at most every 300 ms.
async function follow(runId) {
  if (tx.events) tx.events.close();
  const record = await api(`/v1/runs/${encodeURIComponent(runId)}`);
  if (["completed", "failed", "cancelled", "guardrail_tripped"].includes(record.run.status)) return;
  const root = record.run.root_id || runId;
  const url = `/v1/runs/${encodeURIComponent(root)}/events` + (token ? `?access_token=${encodeURIComponent(token)}` : "");
  const events = (tx.events = new EventSource(url));
  const later = () => {
    clearTimeout(tx.timer);
    tx.timer = setTimeout(refresh, 300);
  };
  for (const name of ["progress", "tool_call", "status"]) events.addEventListener(name, later);
  events.onmessage = (e) => {
    if (e.data === "[DONE]") {
      events.close();
      later();
    }
  };
}

async function compareWithSource() {
  const main = await api(transcriptUrl(tx.runId, tx.agent));
  if (!main.forked_from) return;
  tx.sourceOf = main.forked_from;
  $("tx-source").hidden = false;
  await refresh();
}

function showEditor(turn) {
  tx.forkTurn = turn;
  $("tx-editor").hidden = false;
  $("tx-fork-point").textContent = turn === 0 ? "the message itself" : `after turn ${turn}`;
  $("tx-edit-message").focus();
}

async function forkHere() {
  const message = $("tx-edit-message").value.trim();
  const system = $("tx-edit-system").value.trim();
  const edit = {};
  if (message) edit.message = [{ type: "text", text: message }];
  if (system) edit.system = system;
  $("tx-fork-go").disabled = true;
  try {
    const source = { runId: tx.runId, agent: tx.agent };
    const created = await api(`/v1/runs/${encodeURIComponent(source.runId)}/fork`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ turn: tx.forkTurn, agent: source.agent, edit }),
    });
    $("tx-editor").hidden = true;
    $("tx-edit-message").value = "";
    await openTranscript(created.run_id, null);
    await compareWithSource();
    location.hash = `run=${created.run_id}&node=${created.run_id}`; // the fork's tree, live, beside it
  } catch (err) {
    $("tx-fork-error").textContent = `fork failed: ${err.message}`;
  } finally {
    $("tx-fork-go").disabled = false;
  }
}

// -- rendering ----------------------------------------------------------------------------------------------
function renderTranscript(el, t, forkable, forkedAt) {
  el.replaceChildren();
  el.dataset.agent = t.agent_id;
  el.dataset.run = t.run_id;
  el.dataset.live = String(t.live);
  const head = text("div", "", "tx-meta");
  head.append(text("strong", t.agent_id), text("span", ` ${t.status}`, "tx-status"));
  if (t.attempts > 1) head.append(text("span", ` · attempts ${t.attempts}`, "tx-retries"));
  if (t.error) head.append(text("span", ` · ${t.error.error_type}: ${t.error.message}`, "tx-error"));
  if (t.awaiting.length) head.append(text("span", ` · awaiting approval: ${t.awaiting.join(", ")}`, "tx-awaiting"));
  if (t.decided.length) head.append(text("span", ` · decided: ${t.decided.join(", ")}`, "tx-decided"));
  if (t.forked_from) {
    const f = t.forked_from;
    head.append(text("span", ` · forked from ${f.agent_id} in ${f.run_id} after turn ${f.turn ?? 0}`, "tx-lineage"));
  }
  el.append(head);
  for (const item of inputItems(t.input)) el.append(renderItem(item, "tx-input"));
  t.messages.forEach((m) => {
    el.append(text("h4", `message ${m.index + 1}${m.committed ? "" : " (in progress)"}`));
    for (const a of m.approvals || []) el.append(renderApproval(a));
    for (const turn of m.turns) el.append(renderTurn(turn, forkable, forkedAt));
  });
}

// What the model saw before the first turn: the run's input, or the conversation a fork or handoff carried.
function inputItems(input) {
  if (!input) return [];
  const carried = input.length === 1 && input[0].type === "data" && (input[0].data[FORK_KEY] || input[0].data[HANDOFF_KEY]);
  if (!carried) return [{ kind: "user", blocks: input }];
  const items = [...(carried.items || [])];
  if (carried.system) items.unshift({ kind: "system", blocks: [{ type: "text", text: carried.system }] });
  return items;
}

function renderTurn(turn, forkable, forkedAt) {
  const div = text("div", "", "tx-turn");
  div.dataset.turn = String(turn.turn);
  if (forkedAt && turn.turn <= (forkedAt.turn ?? 0)) div.dataset.shared = "true";
  const u = turn.usage || {};
  const finish = turn.finish_reason ? turn.finish_reason.kind : "";
  const latency = turn.latency_s == null ? "" : ` · ${(turn.latency_s * 1000).toFixed(0)} ms`;
  const head = text("div", `turn ${turn.turn} · ${finish} · in ${u.input_tokens || 0} · out ${u.output_tokens || 0}${latency}${turn.model ? ` · ${turn.model}` : ""}`, "tx-turn-head");
  if (forkable) {
    const b = text("button", "fork from here", "tx-fork");
    b.dataset.turn = String(turn.turn);
    b.onclick = () => showEditor(turn.turn);
    head.append(" ", b);
  }
  div.append(head);
  // The provider retries of this turn's model call (each failed attempt and its error), before its answer.
  for (const r of turn.retries || []) {
    div.append(text("div", `retry after attempt ${r.attempt}: ${r.error_type}${r.message ? `: ${r.message}` : ""} (waited ${r.wait_s} s)`, "tx-retry"));
  }
  div.append(renderItem(turn.item, "tx-model"));
  if (turn.tools) div.append(renderItem(turn.tools, "tx-tools"));
  if (forkedAt && turn.turn === (forkedAt.turn ?? 0)) div.append(text("div", "forked here", "tx-forked-here"));
  return div;
}

// A decision this message carried: who decided and what (the agent recorded it with the message).
function renderApproval(a) {
  const verdict = a.approved ? "approved" : "denied";
  const who = a.decided_by ? ` by ${a.decided_by}` : " (decider not recorded)";
  const div = text("div", `${verdict} ${a.call_id}${who}${a.reason ? `: ${a.reason}` : ""}`, `tx-approval tx-${verdict}`);
  div.dataset.call = a.call_id;
  return div;
}

function renderItem(item, cls) {
  const div = text("div", "", `tx-item ${cls}`);
  div.dataset.kind = item.kind;
  div.append(text("span", item.kind, "tx-kind"));
  for (const b of item.blocks || []) div.append(renderBlock(b));
  return div;
}

function renderBlock(b) {
  if (b.type === "text") return text("div", b.text, "tx-text");
  if (b.type === "thinking") {
    const d = document.createElement("details");
    d.className = "tx-thinking";
    d.append(text("summary", "thinking"), text("pre", b.text || "(redacted)"));
    return d;
  }
  if (b.type === "tool_use") return text("div", `${b.tool_name}(${JSON.stringify(b.arguments)}) [${b.call_id}]`, "tx-call");
  if (b.type === "tool_result") {
    const body = (b.content || []).map((c) => (c.type === "text" ? c.text : c.type === "error" ? `${c.error_type || "error"}: ${c.message || ""}` : JSON.stringify(c))).join(" ");
    const div = text("div", `[${b.call_id}] ${body}`, b.is_error ? "tx-result tx-result-error" : "tx-result");
    div.dataset.call = b.call_id;
    return div;
  }
  return text("pre", JSON.stringify(b), "tx-other");
}
