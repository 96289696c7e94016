// The HTML report's own script: the overview, the fairness table, the charts (Plotly), the trial table.
"use strict";
const overview = JSON.parse(document.getElementById("data-overview").textContent);
const lines = JSON.parse(document.getElementById("data-lines").textContent);
const trials = JSON.parse(document.getElementById("data-trials").textContent);
const STATUS_COLOURS = {ok: "#2e7d32", truncated: "#9ccc65", error: "#ef6c00", timeout: "#c62828",
  output_limit: "#ad1457", memory_limit: "#6a1b9a", cpu_limit: "#4527a0", file_size_limit: "#283593",
  process_limit: "#00838f", interrupted: "#795548", abandoned: "#000000", command_error: "#ff8f00",
  trial_tool_error: "#b71c1c", maximum_tool_calls: "#9e9e9e", maximum_emitted_tokens: "#9e9e9e",
  task_timeout_seconds: "#9e9e9e"};
const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; };
const list = document.getElementById("overview-list");
for (const line of lines) list.appendChild(el("li", line, line.startsWith("fairness: ") && !overview.fairness.same_rules ? "flag" : undefined));
const fair = document.getElementById("fairness");
const majority = overview.fairness.majority;
const networkOf = s => s.network + (s.network === "allow" ? ": " + ((s.allow || []).join(" ") || "nothing") : "");
const rules = [["trials", majority.trials], ["sandbox", majority.sandbox.mode + " (network " + networkOf(majority.sandbox) + ")"],
  ["tokenizer", majority.tokenizer.join(", ")]].concat(Object.entries(majority.limits));
const ft = el("table"); const fh = ft.createTHead().insertRow();
fh.appendChild(el("th", "rule")); fh.appendChild(el("th", "majority"));
const others = overview.fairness.others;
others.forEach(o => fh.appendChild(el("th", "group " + o.group + " (" + o.trials + " trials)")));
const fb = ft.createTBody();
for (const [name, value] of rules) {
  const r = fb.insertRow(); r.insertCell().textContent = name; r.insertCell().textContent = String(value);
  for (const o of others) { const key = ["trials", "sandbox", "tokenizer"].includes(name) ? name : "limits." + name;
    const d = o.differs[key] || (name === "sandbox" ? (o.differs["sandbox.mode"] || o.differs["sandbox.network"] || o.differs["sandbox.allow"]) : undefined);
    const c = r.insertCell(); c.textContent = name === "trials" ? String(o.trials) : d ? String(d[1]) : "same"; if (d) c.className = "flag"; }
}
fair.appendChild(ft);
const share = (name, title) => Plotly.newPlot("chart-" + name, [{type: "bar",
  x: overview.histograms[name].map((_, i) => (i * 5) + "-" + (i * 5 + 5) + "%"), y: overview.histograms[name],
  marker: {color: "#1565c0"}}], {title: {text: title}, margin: {t: 40, b: 60, l: 50, r: 10},
  xaxis: {title: {text: "share of the limit used"}}, yaxis: {title: {text: "trials"}}}, {displayModeBar: false, responsive: true});
share("calls", "calls used"); share("tokens", "tokens delivered"); share("seconds", "trial time used");
Plotly.newPlot("chart-ended", [{type: "bar", x: Object.keys(overview.ended_by), y: Object.values(overview.ended_by),
  marker: {color: "#6d4c41"}}], {title: {text: "what ended each trial"}, margin: {t: 40, b: 60, l: 50, r: 10},
  yaxis: {title: {text: "trials"}}}, {displayModeBar: false, responsive: true});

const groupOf = t => (t.fairness && t.fairness.group) || 1;
const reasonOf = t => t.integrity.verdict + (t.integrity.why ? ": " + t.integrity.why : "");
const columns = [["trial", t => t.state + (t.labels && Object.keys(t.labels).length ? "  [" + Object.entries(t.labels).map(([k, v]) => k + "=" + v).join(" ") + "]" : "")],
  ["id", t => (t.trial_id || "").slice(0, 12)], ["rules", t => groupOf(t) === 1 ? "majority" : "group " + groupOf(t)],
  ["calls", t => t.used.calls, t => t.limits.max_calls], ["tokens", t => t.used.tokens, t => t.limits.max_tokens],
  ["secs", t => t.used.seconds, t => t.limits.trial_timeout],
  ["denied", t => t.sandbox.network === "allow" ? (t.connections || {}).denied || 0 : ""], ["ended by", t => t.ended_by || ""],
  ["integrity", reasonOf], ["score", t => t.score === undefined ? "" : t.score]];
const head = document.querySelector("#trials thead tr");
let sortBy = -1, ascending = true, shown = 500;
columns.forEach(([name], i) => { const th = el("th", name); th.onclick = () => { ascending = sortBy === i ? !ascending : true; sortBy = i; draw(); }; head.appendChild(th); });
// Two markers, never one for both: other rules (the fairness check) and the verdict (integrity).
const VERDICT_CLASS = {failed: "v-failed", signature_invalid: "v-failed", unconfirmed: "v-doubt", in_flight: "v-doubt",
  unverified: "v-doubt", unsigned: "v-doubt"};
trials.forEach((t, i) => { t._index = i; t._other = groupOf(t) !== 1; t._verdict = VERDICT_CLASS[t.integrity.verdict] || "";
  t._text = [t.state, t.trial_id, reasonOf(t), t.ended_by || "", JSON.stringify(t.labels || {})].join(" ").toLowerCase(); });
const filter = document.getElementById("filter");
filter.oninput = () => { shown = 500; draw(); };
document.getElementById("more").onclick = () => { shown += 500; draw(); };
function draw() {
  const needle = filter.value.toLowerCase();
  let rows = trials.filter(t => !needle || t._text.includes(needle));
  if (sortBy >= 0) { const get = columns[sortBy][1]; rows = rows.slice().sort((a, b) => { const x = get(a), y = get(b);
    return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1); }); }
  const body = document.querySelector("#trials tbody"); body.textContent = "";
  for (const t of rows.slice(0, shown)) {
    const r = body.insertRow(); r.className = "trial" + (t._other ? " other-rules" : ""); r.dataset.index = t._index;
    for (const [name, get, limit] of columns) { const c = r.insertCell(); c.textContent = limit ? get(t) + " / " + limit(t) : String(get(t));
      if (name === "rules" && t._other) c.className = "other-rules-cell";
      if (name === "integrity" && t._verdict) c.className = t._verdict; }
    r.onclick = () => toggle(r, t);
  }
  document.getElementById("count").textContent = rows.length + " of " + trials.length + " trials" + (rows.length > shown ? ", first " + shown + " shown" : "");
  document.getElementById("more").hidden = rows.length <= shown;
}
function toggle(row, t) {
  const next = row.nextSibling;
  if (next && next.classList.contains("detail-row")) { next.remove(); return; }
  const r = document.createElement("tr"); r.className = "detail-row"; const c = r.insertCell(); c.colSpan = columns.length;
  row.after(r); detail(t, c);
}
function detail(t, container) {
  // Attached before the charts are drawn, so that Plotly sizes them to their boxes.
  const box = el("div", undefined, "detail"); container.appendChild(box);
  box.appendChild(el("div", "trial " + t.trial_id + " — " + t.state + " — integrity " + t.integrity.verdict + (t.integrity.why ? ": " + t.integrity.why : "")));
  if (!t.calls) { box.appendChild(el("p", "Calls not embedded in this page: trial-tool show --state " + t.state + " --log " + t.log, "muted")); return box; }
  const charts = el("div", undefined, "charts"); const burn = el("div", undefined, "chart"); const line = el("div", undefined, "chart");
  charts.appendChild(burn); charts.appendChild(line); box.appendChild(charts);
  const timed = t.calls.filter(c => typeof c.end === "number");
  const label = c => (c.sequence === null || c.sequence === undefined ? "" : "#" + c.sequence) + " r" + c.record;
  const byCall = timed.slice().sort((a, b) => ((a.sequence || 0) - (b.sequence || 0)) || (a.record - b.record));
  const bad = t.integrity.first_bad_record;
  const limitLine = {type: "line", yref: "paper", y0: 0, y1: 1, x0: t.limits.trial_timeout, x1: t.limits.trial_timeout,
    line: {color: "#b00020", width: 2}};
  const limitNote = {xref: "x", yref: "paper", x: t.limits.trial_timeout, y: 1, text: "trial limit " + t.limits.trial_timeout + " s",
    showarrow: false, xanchor: "right", yanchor: "bottom", font: {color: "#b00020", size: 11}};
  const xs = [0].concat(timed.map(c => c.end));
  const callsLeft = [t.limits.max_calls].concat(timed.map(c => t.limits.max_calls - (c.calls_after || 0)));
  const tokensLeft = [t.limits.max_tokens].concat(timed.map(c => t.limits.max_tokens - (c.tokens_after || 0)));
  Plotly.newPlot(burn, [
    {x: xs, y: callsLeft, name: "calls left", mode: "lines+markers", line: {shape: "hv", color: "#1565c0"}},
    {x: xs, y: tokensLeft, name: "tokens left", mode: "lines+markers", yaxis: "y2", line: {shape: "hv", color: "#ef6c00"}}],
    {title: {text: "burn-down"}, margin: {t: 40, b: 40, l: 50, r: 60}, xaxis: {title: {text: "trial time (s)"}},
     yaxis: {title: {text: "calls left"}, range: [0, t.limits.max_calls * 1.05]},
     yaxis2: {title: {text: "tokens left"}, overlaying: "y", side: "right", range: [0, t.limits.max_tokens * 1.05]},
     shapes: [{type: "line", xref: "paper", x0: 0, x1: 1, y0: t.limits.max_calls, y1: t.limits.max_calls, line: {dash: "dash", color: "#1565c0"}},
              {type: "line", xref: "paper", yref: "y2", x0: 0, x1: 1, y0: t.limits.max_tokens, y1: t.limits.max_tokens, line: {dash: "dot", color: "#ef6c00"}},
              limitLine], annotations: [limitNote],
     legend: {orientation: "h"}}, {displayModeBar: false, responsive: true});
  const statuses = [...new Set(timed.map(c => c.status))];
  Plotly.newPlot(line, statuses.map(s => { const cs = timed.filter(c => c.status === s);
    return {type: "bar", orientation: "h", name: s, base: cs.map(c => c.end - (c.duration || 0)), x: cs.map(c => Math.max(c.duration || 0, 0.001)),
      y: cs.map(label), marker: {color: STATUS_COLOURS[s] || "#607d8b", line: {color: cs.map(c => c.record === bad ? "#b00020" : "rgba(0,0,0,0)"), width: 3}}}; }),
    {title: {text: "calls over trial time, by call number"}, barmode: "overlay", margin: {t: 40, b: 40, l: 60, r: 10},
     xaxis: {title: {text: "trial time (s)"}}, yaxis: {type: "category", categoryorder: "array", categoryarray: byCall.map(label), autorange: "reversed"},
     shapes: [limitLine], annotations: [limitNote], legend: {orientation: "h"}}, {displayModeBar: false, responsive: true});
  const table = el("table", undefined, "calls"); const h = table.createTHead().insertRow();
  for (const name of ["record", "call", "status", "secs", "exit", "tokens", "command and what the agent read"]) h.appendChild(el("th", name));
  const b = table.createTBody();
  for (const c of t.calls) {
    const r = b.insertRow(); r.insertCell().textContent = c.record;
    r.insertCell().textContent = c.sequence === null || c.sequence === undefined ? "-" : c.sequence; r.insertCell().textContent = c.status;
    if (c.record === bad) { r.className = "bad-record"; }
    r.insertCell().textContent = (c.duration || 0).toFixed(2); r.insertCell().textContent = c.exit === null || c.exit === undefined ? "-" : c.exit;
    r.insertCell().textContent = c.tokens === null || c.tokens === undefined ? "-" : c.tokens + " / " + c.allowance + (c.clipped ? " (clipped)" : "");
    const cell = r.insertCell();
    if (c.record === bad) cell.appendChild(el("div", t.integrity.verdict + " here: " + (t.integrity.why || ""), "flag"));
    cell.appendChild(el("code", c.command));
    if (c.stdout) cell.appendChild(el("pre", c.stdout));
    if (c.stderr) { cell.appendChild(el("div", "stderr", "muted")); cell.appendChild(el("pre", c.stderr)); }
    if (c.more) cell.appendChild(el("div", "(cut here; trial-tool show --record " + c.record + " has it all)", "muted"));
    if (c.matches === false) cell.appendChild(el("div", "the delivered text does not match the record's hash", "flag"));
    if (c.error) cell.appendChild(el("div", c.error, "muted"));
  }
  box.appendChild(table);
  return box;
}
draw();
document.body.dataset.ready = "yes";
