// Plexus dashboard: plain JS, no build step. Live over the gateway's SSE endpoint (no polling).
"use strict";

const TERMINAL = new Set(["completed", "failed", "cancelled", "guardrail_tripped"]);
const GROUP_MIN = 5; // siblings of one type fanned out by a parent collapse into a group from this many on
const $ = (id) => document.getElementById(id);

const params = new URLSearchParams(location.search);
if (params.get("token")) localStorage.setItem("plexus.token", params.get("token"));
let token = localStorage.getItem("plexus.token") || "";

let state = null; // the run tree being watched
let source = null; // its EventSource
let liveAgents = new Set(); // "ns/type" refs with a live worker
let renderQueued = false;
let lastWorkersRefresh = 0;

function authHeaders() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...authHeaders(), ...(options.headers || {}) } });
  if (response.status === 401) {
    $("auth").hidden = false;
    throw new Error("unauthorized");
  }
  const body = response.status === 204 ? null : await response.json();
  if (!response.ok) throw new Error(body && (body.detail || body.title) || response.statusText);
  return body;
}

$("token-save").onclick = () => {
  token = $("token").value.trim();
  localStorage.setItem("plexus.token", token);
  $("auth").hidden = true;
  if (source) source.close();
  state = null; // reopen the stream with the new token
  route();
  followRuns();
};

// -- runs list --------------------------------------------------------------------------------------------
async function loadRuns() {
  const q = new URLSearchParams({ roots_only: "true", limit: "100" });
  const status = $("f-failed").checked ? "failed" : $("f-status").value;
  if (status) q.set("status", status);
  if ($("f-agent").value.trim()) q.set("agent_type", $("f-agent").value.trim());
  const page = await api(`/v1/runs?${q}`);
  const list = $("runs");
  list.replaceChildren();
  for (const r of page.runs) {
    const li = document.createElement("li");
    li.dataset.run = r.run_id;
    li.append(badge(displayStatus(r)), text("span", r.agent_id), text("span", new Date(r.created_at * 1000).toLocaleTimeString(), "meta"));
    li.onclick = () => { location.hash = `run=${r.run_id}`; };
    list.append(li);
  }
}
// The list follows the cluster live: the gateway names the runs whose records changed, and the list (with its
// filters) is read again, at most every half second; after a reconnection too.
let changes = null;
let reloadQueued = null;
function followRuns() {
  if (changes) changes.close();
  changes = new EventSource("/v1/runs/changes" + (token ? `?access_token=${encodeURIComponent(token)}` : ""));
  const reload = () => {
    if (reloadQueued) return;
    reloadQueued = setTimeout(() => { reloadQueued = null; loadRuns().catch((err) => console.warn(err)); }, 500);
  };
  changes.addEventListener("ready", reload);
  changes.addEventListener("changed", reload);
  $("runs").dataset.live = "connecting";
  changes.onopen = () => { $("runs").dataset.live = "live"; };
  changes.onerror = () => { $("runs").dataset.live = changes.readyState === EventSource.CLOSED ? "closed" : "reconnecting"; };
}
for (const id of ["f-status", "f-failed"]) $(id).onchange = loadRuns;
$("f-agent").onchange = loadRuns;
$("f-refresh").onclick = loadRuns;

// -- helpers ----------------------------------------------------------------------------------------------
function text(tag, value, cls) {
  const el = document.createElement(tag);
  el.textContent = value;
  if (cls) el.className = cls;
  return el;
}

function badge(status) {
  const el = text("span", status, "badge");
  el.dataset.status = status;
  return el;
}

function agentType(agentId) {
  const parts = agentId.split("/");
  return parts[parts.length - 2];
}

function agentRef(agentId) {
  const parts = agentId.split("/");
  return parts.length === 3 ? `${parts[0]}/${parts[1]}` : `default/${parts[0]}`;
}

// The status a person needs to see, from the run record (and the registry, for "lost").
function displayStatus(run) {
  const status = run.status || "pending";
  if (status === "failed" && run.error && run.error.error_type === "BudgetExhaustedError") return "budget exceeded";
  if (status === "pending" && run.attempts > 0 && run.retry_at) {
    const retries = run.retry && Number.isInteger(run.retry.max_retries) ? run.retry.max_retries : 3;
    const last = run.error && run.error.error_type ? ` (${run.error.error_type})` : "";
    return `retrying ${run.attempts}/${retries + 1}${last}`;
  }
  if (status === "running" && state && liveAgents.size && !liveAgents.has(agentRef(run.agent_id))) return "lost";
  if (status === "running" && state && childrenOf(run).some((c) => !TERMINAL.has(c.status))) {
    return "waiting on children";
  }
  return status;
}

// -- tree view --------------------------------------------------------------------------------------------
function openTree(runId, selectNode) {
  if (source) source.close();
  state = { rootId: runId, runs: new Map(), nodes: new Map(), usage: {}, budget: null, selected: selectNode || null, expanded: new Set(), done: false };
  $("tree-pane").hidden = false;
  $("workers-pane").hidden = true;
  $("tree-title").textContent = runId;
  $("cancel").disabled = false;
  const url = `/v1/runs/${encodeURIComponent(runId)}/events` + (token ? `?access_token=${encodeURIComponent(token)}` : "");
  source = new EventSource(url);
  setConn("connecting");
  source.onopen = () => setConn("live");
  source.onerror = () => {
    if (state && state.done) return setConn("ended");
    // EventSource retries (resuming with Last-Event-ID) unless the answer was an error status: then it is
    // closed for good, most likely a missing or wrong token.
    if (source.readyState === EventSource.CLOSED) {
      setConn("closed");
      $("auth").hidden = false;
      return;
    }
    setConn("reconnecting");
  };
  source.addEventListener("snapshot", (e) => {
    const data = JSON.parse(e.data);
    for (const r of data.runs) upsertRun(r);
    applyUsage(data);
    refreshWorkers();
  });
  source.addEventListener("status", (e) => {
    const data = JSON.parse(e.data);
    if (data.run) upsertRun(data.run);
    applyUsage(data);
    // Event-driven refreshes: the runs list when the root changes, the live workers (for "lost") at most
    // every 5 s while statuses change.
    if (data.run && data.run.run_id === state.rootId) loadRuns().catch((err) => console.warn(err));
    if (Date.now() - lastWorkersRefresh > 5000) refreshWorkers();
  });
  source.addEventListener("token", (e) => {
    const data = JSON.parse(e.data);
    const n = node(data.agent_id);
    if (data.delta && typeof data.delta.text === "string") {
      n.live = (n.live || "") + data.delta.text; // streamed text as it arrives
      queueRender();
    }
  });
  for (const name of ["progress", "tool_call"]) {
    source.addEventListener(name, (e) => {
      const data = JSON.parse(e.data);
      if (data.run) upsertRun(data.run);
      applyProgress(data.progress);
      applyUsage(data);
    });
  }
  source.onmessage = (e) => {
    if (e.data === "[DONE]") {
      state.done = true;
      source.close();
      setConn("ended");
      queueRender();
    }
  };
}

function setConn(value) {
  $("conn").dataset.state = value;
  $("conn").textContent = value;
}

function node(agentId) {
  let n = state.nodes.get(agentId);
  if (!n) {
    n = { agentId, runId: null, step: "", stream: [], turns: 0 };
    state.nodes.set(agentId, n);
  }
  return n;
}

function upsertRun(run) {
  const old = state.runs.get(run.run_id);
  if (old && (old.updated_at || 0) > (run.updated_at || 0)) return; // an older read arriving late
  state.runs.set(run.run_id, run);
  node(run.agent_id).runId = run.run_id;
  queueRender();
}

function applyProgress(p) {
  if (!p || !p.agent_id || p.agent_id.startsWith("orchestrator/")) return;
  const n = node(p.agent_id);
  n.runId = n.runId || p.run_id;
  n.step = p.step;
  n.turns += 1;
  const words = (p.content || []).filter((b) => b.type === "text").map((b) => b.text).join("");
  if (words) n.stream.push(`[${p.step}] ${words}`);
  // LLM agents report their model usage so far with their progress (plexus.llm): kept per node, live.
  if (p.metadata && p.metadata.usage) n.usage = p.metadata.usage;
  // An LLM agent handing its conversation to another (plexus.llm handoffs): the target holds it now.
  if (p.step === "handoff" && p.metadata && p.metadata.from && p.metadata.to) {
    node(p.metadata.to).handoffFrom = p.metadata.from;
    n.handedTo = p.metadata.to;
  }
  queueRender();
}

const USAGE_PARTS = [["input_tokens", "in"], ["output_tokens", "out"], ["cached_tokens", "cached"], ["reasoning_tokens", "reasoning"]];

function usageText(u) {
  const parts = USAGE_PARTS.map(([key, label]) => `${label} ${u[key] || 0}`);
  if (u.cost && u.cost.amount !== undefined) parts.push(`$${Number(u.cost.amount).toFixed(4)}`);
  return parts.join(" · ");
}

function rolledUpUsage() {
  const total = { input_tokens: 0, output_tokens: 0, cached_tokens: 0, reasoning_tokens: 0 };
  let cost = null;
  for (const n of state.nodes.values()) {
    if (!n.usage) continue;
    for (const [key] of USAGE_PARTS) total[key] += n.usage[key] || 0;
    if (n.usage.cost && n.usage.cost.amount !== undefined) cost = (cost || 0) + Number(n.usage.cost.amount);
  }
  if (cost !== null) total.cost = { amount: cost };
  return total;
}

function applyUsage(data) {
  if (data.usage) state.usage = data.usage;
  if (data.budget) state.budget = data.budget;
  queueRender();
}

function setGauge(id, used, limit, label) {
  const meter = $(id);
  meter.max = limit || Math.max(used, 1);
  meter.value = used;
  meter.dataset.used = String(used);
  $(`${id}-text`).textContent = limit ? `${label(used)} / ${label(limit)}` : `${label(used)} (no limit)`;
}

function queueRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => { renderQueued = false; render(); });
}

function render() {
  if (!state) return;
  const root = state.runs.get(state.rootId);
  const b = state.budget;
  if (b) {
    setGauge("g-tokens", b.tokens.used, b.tokens.limit, (v) => String(v));
    setGauge("g-turns", b.turns.used, b.turns.limit, (v) => String(v));
    setGauge("g-cost", b.cost_usd.used, b.cost_usd.limit, (v) => `$${Number(v).toFixed(4)}`);
  }
  const active = [...state.runs.values()].filter((r) => !TERMINAL.has(r.status)).length;
  const maxAgents = root && root.spawn_budget ? root.spawn_budget.max_agents : null;
  setGauge("g-spawn", active, maxAgents, (v) => String(v));
  if (root) {
    const s = displayStatus(root);
    $("tree-status").textContent = s;
    $("tree-status").dataset.status = s;
    $("cancel").disabled = TERMINAL.has(root.status);
  }
  const tree = $("tree");
  tree.replaceChildren();
  if (root) {
    state.span = timeSpan(root);
    const li = renderNode(root);
    if (li) tree.append(li);
    $("t-axis").textContent = `timeline: ${((state.span.end - state.span.start)).toFixed(1)} s since the root started`;
    const total = rolledUpUsage();
    // Only LLM agents report model usage live; a tree without any shows no usage line.
    const any = [...state.nodes.values()].some((n) => n.usage);
    $("t-usage").textContent = any ? `model tokens, whole tree: ${usageText(total)}` : "";
    for (const [key] of USAGE_PARTS) $("t-usage").dataset[key.split("_")[0]] = String(total[key]);
  }
  renderDetail();
}

// The synchronized timeline: every node's bar on one axis, from the root's start to the last end (or now,
// while anything runs). Records carry created_at and, once a run ended, its last update as the end.
function runEnd(run) {
  return TERMINAL.has(run.status) ? run.updated_at || run.created_at : Date.now() / 1000;
}

function timeSpan(root) {
  const runs = [...state.runs.values()];
  const start = root.created_at || Math.min(...runs.map((r) => r.created_at || Infinity));
  const end = Math.max(start + 0.001, ...runs.map(runEnd));
  return { start, end };
}

function timelineBar(run) {
  const { start, end } = state.span;
  const width = end - start;
  const from = Math.max(0, ((run.created_at || start) - start) / width);
  const to = Math.min(1, (runEnd(run) - start) / width);
  const track = document.createElement("span");
  track.className = "timeline";
  const bar = document.createElement("span");
  bar.className = "bar";
  bar.dataset.status = displayStatus(run);
  bar.dataset.from = from.toFixed(4);
  bar.dataset.to = to.toFixed(4);
  bar.style.left = `${(from * 100).toFixed(2)}%`;
  bar.style.width = `${(Math.max(0.005, to - from) * 100).toFixed(2)}%`;
  bar.title = `${((run.created_at || start) - start).toFixed(2)} s → ${(runEnd(run) - start).toFixed(2)} s`;
  track.append(bar);
  return track;
}

// Children by their own parent_id: a parent's record may be older than a child's announcement.
function childrenOf(run) {
  const out = [...state.runs.values()].filter((r) => r.parent_id === run.run_id && r.run_id !== run.run_id);
  return out.sort((a, b) => (a.created_at || 0) - (b.created_at || 0));
}

function failedBelow(run) {
  if (run.status === "failed") return true;
  return childrenOf(run).some(failedBelow);
}

// Token figures, labelled (issue 44): "own" is what the run's own agent spent; "tree" (the root only) its whole
// tree's total, as the gauge shows it. A root's record holds the tree's total in `usage`, a child's its own.
function tokenFigures(run) {
  const own = run.own_usage && run.own_usage.tokens;
  if (run.parent_id) return { own: Math.max(own || 0, (run.usage && run.usage.tokens) || 0), tree: null };
  const used = state.budget ? state.budget.tokens.used : 0;
  return { own: own || 0, tree: Math.max(used, (run.usage && run.usage.tokens) || 0) };
}

function renderNode(run) {
  if ($("t-failed").checked && !failedBelow(run)) return null;
  const n = node(run.agent_id);
  const li = document.createElement("li");
  const row = document.createElement("div");
  row.className = "node" + (state.selected === run.run_id ? " selected" : "");
  const status = displayStatus(run);
  li.dataset.agent = run.agent_id;
  li.dataset.status = status;
  li.dataset.run = run.run_id;
  li.className = "tree-node";
  const tokens = tokenFigures(run);
  const tokenText = `tokens own ${tokens.own}` + (tokens.tree === null ? "" : ` · tree ${tokens.tree}`);
  const meta = text("span", `step ${n.step || "-"} · ${tokenText} · events ${n.turns}`, "meta");
  meta.dataset.own = String(tokens.own);
  if (tokens.tree !== null) meta.dataset.tree = String(tokens.tree);
  row.append(
    text("span", run.agent_id, "agent"),
    badge(status),
    meta,
    timelineBar(run),
  );
  if (n.usage) {
    const u = text("span", usageText(n.usage), "meta usage");
    for (const [key] of USAGE_PARTS) u.dataset[key.split("_")[0]] = String(n.usage[key] || 0);
    row.append(u);
  }
  if (n.handoffFrom) {
    li.dataset.handoff = n.handoffFrom;
    row.append(text("span", `handoff from ${n.handoffFrom}`, "handoff"));
  }
  if (n.handedTo) row.append(text("span", `handed off to ${n.handedTo}`, "handoff handed"));
  if (run.reason && TERMINAL.has(run.status)) row.append(text("span", run.reason, "meta"));
  row.dataset.select = run.run_id;
  li.append(row);
  const children = childrenOf(run);
  if (children.length) {
    const ul = document.createElement("ul");
    const byType = new Map();
    for (const child of children) {
      const t = agentType(child.agent_id);
      if (!byType.has(t)) byType.set(t, []);
      byType.get(t).push(child);
    }
    for (const [type, group] of byType) {
      const key = `${run.run_id}:${type}`;
      if (group.length >= GROUP_MIN && !state.expanded.has(key)) {
        ul.append(renderGroup(key, type, group));
      } else {
        for (const child of group) {
          const childLi = renderNode(child);
          if (childLi) ul.append(childLi);
        }
      }
    }
    li.append(ul);
  }
  return li;
}

function renderGroup(key, type, group) {
  const counts = {};
  for (const child of group) {
    const s = displayStatus(child);
    counts[s] = (counts[s] || 0) + 1;
  }
  const li = document.createElement("li");
  li.className = "group";
  li.dataset.group = type;
  const row = document.createElement("div");
  row.className = "node";
  row.append(text("span", `${group.length} × ${type}`, "agent"));
  for (const [s, count] of Object.entries(counts)) {
    const b = badge(`${s} ${count}`);
    b.dataset.status = s;
    row.append(b);
  }
  row.dataset.expand = key;
  li.append(row);
  return li;
}

function select(runId) {
  state.selected = runId;
  history.replaceState(null, "", `#run=${state.rootId}&node=${runId}`);
  queueRender();
}

function renderDetail() {
  const run = state.selected && state.runs.get(state.selected);
  if (!run) {
    $("d-title").textContent = "Select a node";
    $("d-links").replaceChildren();
    $("d-fields").replaceChildren();
    $("d-stream").textContent = "";
    return;
  }
  $("d-title").textContent = run.agent_id;
  const links = $("d-links");
  links.replaceChildren();
  if (run.parent_id) {
    const a = text("a", "↑ parent", "nav-parent");
    a.href = "#";
    a.dataset.select = run.parent_id;
    links.append(a, document.createTextNode(" "));
  }
  for (const child of childrenOf(run)) {
    const a = text("a", `↓ ${child.agent_id}`, "nav-child");
    a.href = "#";
    a.dataset.select = child.run_id;
    links.append(a, document.createTextNode(" "));
  }
  const fields = $("d-fields");
  fields.replaceChildren();
  const rows = {
    run: run.run_id, status: displayStatus(run), reason: run.reason || "", attempts: run.attempts || 0,
    priority: run.priority ?? 2, depth: run.depth || 0,
    "tokens own": tokenFigures(run).own, "tokens tree": tokenFigures(run).tree ?? "-",
    error: run.error ? `${run.error.error_type}: ${run.error.message}` : "",
  };
  for (const [k, v] of Object.entries(rows)) fields.append(text("dt", k), text("dd", String(v)));
  const n = node(run.agent_id);
  $("d-stream").textContent = n.stream.join("\n") + (n.live ? `\n${n.live}` : "");
}

// The tree and the links are redrawn on every event, so a row may be replaced between a press and its
// release (no click then): act on the press, delegated from containers that are never replaced.
for (const id of ["tree", "d-links"]) {
  $(id).addEventListener("pointerdown", (e) => {
    const target = e.target.closest("[data-select], [data-expand]");
    if (!target || !state) return;
    e.preventDefault();
    if (target.dataset.expand) {
      state.expanded.add(target.dataset.expand);
      queueRender();
    } else {
      select(target.dataset.select);
    }
  });
  $(id).addEventListener("click", (e) => e.preventDefault());
}

$("t-failed").onchange = queueRender;
$("cancel").onclick = async () => {
  if (!state) return;
  $("cancel").disabled = true;
  try {
    await api(`/v1/runs/${encodeURIComponent(state.rootId)}/cancel`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ reason: "cancelled from the dashboard" }),
    });
  } catch (err) {
    $("cancel").disabled = false;
    alert(`cancel failed: ${err.message}`);
  }
};

// -- workers ----------------------------------------------------------------------------------------------
async function refreshWorkers() {
  lastWorkersRefresh = Date.now();
  try {
    const workers = await api("/v1/workers");
    liveAgents = new Set(workers.flatMap((w) => w.types));
    const body = $("workers");
    body.replaceChildren();
    for (const w of workers) {
      const tr = document.createElement("tr");
      const owned = Object.entries(w.partitions || {}).map(([ref, ps]) => `${ref}: ${ps.join(",")}`).join("; ");
      tr.append(
        text("td", w.worker_id), text("td", w.types.join(", ")), text("td", owned),
        text("td", w.detail.host || ""), text("td", String(w.detail.concurrency || "")),
      );
      body.append(tr);
    }
    queueRender();
  } catch (err) {
    console.warn(err);
  }
}

// -- routing ----------------------------------------------------------------------------------------------
function route() {
  const hash = new URLSearchParams(location.hash.slice(1));
  loadRuns().catch((err) => console.warn(err));
  const page = ["#workers", "#schedules"].includes(location.hash) ? location.hash : ""; // schedules.js: its own
  $("workers-pane").hidden = page !== "#workers";
  if (page) $("tree-pane").hidden = true;
  if (page === "#workers") {
    refreshWorkers();
  } else if (hash.get("run")) {
    if (!state || state.rootId !== hash.get("run")) openTree(hash.get("run"), hash.get("node"));
    else $("tree-pane").hidden = false;
  }
}
window.addEventListener("hashchange", route);
route();
followRuns();

// Running bars grow with the clock: re-render once a second while the open tree has live runs.
setInterval(() => {
  if (state && [...state.runs.values()].some((r) => !TERMINAL.has(r.status))) queueRender();
}, 1000);
