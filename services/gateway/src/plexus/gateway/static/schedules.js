// The schedules page (#schedules): scheduled runs with their next fires and last runs (links to the run
// trees), and pause / resume / trigger / delete. Uses app.js's api(), text(), badge() and token.
"use strict";

let schedFollow = null; // the runs-changes stream while the page is shown: a fire starts (or ends) a run
let schedReload = null;

function schedWhen(ts) {
  const secs = Math.round(ts - Date.now() / 1000);
  const rel = secs >= 0 ? `in ${schedSpan(secs)}` : `${schedSpan(-secs)} ago`;
  return `${new Date(ts * 1000).toLocaleString()} (${rel})`;
}

function schedSpan(secs) {
  if (secs < 120) return `${secs} s`;
  if (secs < 7200) return `${Math.round(secs / 60)} min`;
  if (secs < 172800) return `${Math.round(secs / 3600)} h`;
  return `${Math.round(secs / 86400)} d`;
}

function schedSpec(s) {
  if (s.cron) return `cron ${s.cron}${s.tz ? ` (${s.tz})` : " (UTC)"}`;
  return `every ${s.every_s} s`;
}

function schedButton(label, cls, action) {
  const button = text("button", label, cls);
  button.onclick = async () => {
    button.disabled = true;
    try {
      await action();
    } catch (err) {
      $("schedules-error").textContent = `${label} failed: ${err.message}`;
    }
    await loadSchedules();
  };
  return button;
}

function schedRow(info) {
  const s = info.schedule;
  const path = `/v1/schedules/${encodeURIComponent(s.id)}`;
  const tr = document.createElement("tr");
  tr.dataset.schedule = s.id;
  tr.dataset.paused = String(s.paused);
  const next = text("td", s.paused ? "paused" : info.next_fires.length ? schedWhen(info.next_fires[0]) : "-", "sched-next");
  if (info.next_fires.length) next.title = info.next_fires.map((t) => new Date(t * 1000).toLocaleString()).join("\n");
  const runs = document.createElement("td");
  runs.className = "sched-runs";
  for (const run of info.state.last_runs.slice(0, 5)) {
    const item = document.createElement("div");
    const status = run.outcome === "started" ? run.status || "pending" : run.outcome;
    item.append(badge(status), " ");
    if (run.outcome === "started") {
      const link = text("a", run.run_id, "sched-run");
      link.href = `#run=${encodeURIComponent(run.run_id)}`;
      item.append(link);
    } else {
      item.append(text("span", run.error || run.run_id, "meta"));
    }
    item.append(" ", text("span", new Date(run.fired_at * 1000).toLocaleTimeString() + (run.manual ? " (trigger)" : ""), "meta"));
    runs.append(item);
  }
  const counts = `${info.state.fires} fire(s), ${info.state.skipped} skipped` + (info.state.buffered ? ", 1 held" : "");
  runs.append(text("div", counts, "meta"));
  const actions = document.createElement("td");
  actions.className = "sched-actions";
  actions.append(
    s.paused
      ? schedButton("Resume", "sched-resume", () => api(`${path}/resume`, { method: "POST" }))
      : schedButton("Pause", "sched-pause", () => api(`${path}/pause`, { method: "POST" })),
    schedButton("Trigger", "sched-trigger", () => api(`${path}/trigger`, { method: "POST" })),
    schedButton("Delete", "sched-delete danger", async () => {
      if (confirm(`Delete the scheduled run ${s.id}? Its running runs go on.`)) await api(path, { method: "DELETE" });
    }),
  );
  tr.append(text("td", s.id, "sched-id"), text("td", s.agent_id), text("td", `${schedSpec(s)}, overlap ${s.overlap}`), next, runs, actions);
  return tr;
}

async function loadSchedules() {
  try {
    const listed = await api("/v1/schedules");
    const body = $("schedules");
    body.replaceChildren(...listed.schedules.map(schedRow));
    $("schedules-count").textContent = `${listed.schedules.length} of at most ${listed.limit}`;
    body.dataset.loaded = String(Date.now());
  } catch (err) {
    $("schedules-error").textContent = err.message;
  }
}

function showSchedules() {
  const shown = location.hash === "#schedules";
  $("schedules-pane").hidden = !shown;
  if (!shown) {
    if (schedFollow) schedFollow.close();
    schedFollow = null;
    return;
  }
  $("schedules-error").textContent = "";
  loadSchedules();
  if (schedFollow) return;
  schedFollow = new EventSource("/v1/runs/changes" + (token ? `?access_token=${encodeURIComponent(token)}` : ""));
  schedFollow.addEventListener("changed", () => {
    if (schedReload) return;
    schedReload = setTimeout(() => { schedReload = null; loadSchedules(); }, 500);
  });
}

$("schedules-refresh").onclick = loadSchedules;
window.addEventListener("hashchange", showSchedules);
showSchedules();
