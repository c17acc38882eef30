// The live view: reads /api/topologies every few seconds and draws each topology
// with plotly.js (served by this same server). ?every=MS sets the interval.
"use strict";

const EVERY_MS = Number(new URLSearchParams(location.search).get("every")) || 2000;
const COLORS = {
  acked: "#2b8a3e", failed: "#c92a2a", timed_out: "#f08c00", rejected: "#862e9c",
  replayed: "#1971c2", dead_lettered: "#212529",
};
// the legend above the plot, clear of the time axis and its title
const LAYOUT = {
  margin: { l: 50, r: 10, t: 30, b: 50 }, hovermode: "x unified",
  legend: { orientation: "h", x: 0, y: 1.02, xanchor: "left", yanchor: "bottom" },
};
const CONFIG = { displaylogo: false, responsive: true };

// one clock and number format throughout, the browser's locale: the page's own text
// and plotly's axes (told whether the locale counts hours to 12 or 24)
const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString());
const ms = (n) => (n === null || n === undefined ? "–" : `${Math.round(n).toLocaleString()} ms`);
const when = (t) => new Date(t).toLocaleTimeString();
const whenFull = (t) => new Date(t).toLocaleString();
const HOUR12 = new Intl.DateTimeFormat(undefined, { hour: "numeric" }).resolvedOptions().hour12;
const CLOCK = HOUR12 ? "%I:%M:%S %p" : "%H:%M:%S";
const TIME_AXIS = (title) => ({ type: "date", tickformat: CLOCK, hoverformat: CLOCK, title: { text: title } });

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function section(name) {
  let el = document.querySelector(`section.topology[data-name="${CSS.escape(name)}"]`);
  if (!el) {
    el = document.getElementById("topology").content.firstElementChild.cloneNode(true);
    el.dataset.name = name;
    el.querySelector(".name").textContent = name;
    el.querySelector(".replay-all").addEventListener("click", () => replayAll(el));
    document.getElementById("topologies").appendChild(el);
  }
  return el;
}

function figures(s) {
  const held = Object.values(s.held || {}).reduce((n, h) => n + h.tuples, 0);
  let lag = null;
  for (const parts of Object.values(s.partitions || {}))
    for (const p of Object.values(parts)) lag = (lag || 0) + p.lag;
  return {
    acked: fmt(s.acked), failed: fmt(s.failed), timed_out: fmt(s.timed_out),
    replayed: fmt(s.replayed), rejected: fmt(s.rejected), dead_lettered: fmt(s.dead_lettered),
    pending: fmt(s.pending), held: s.held ? fmt(held) : "–", lag: fmt(lag),
    p99: s.latency_ms ? ms(s.latency_ms.p99) : "–",
  };
}

function drawRun(el, t) {
  // the header: running or stopped, since when, the last batch, the rates, Spark's UI
  const run = t.status.run, said = (key) => el.querySelector(`[data-run="${key}"]`);
  const state = said("state"), link = said("spark-ui");
  if (!run) {
    state.textContent = "no run recorded"; state.className = "state";
    for (const key of ["since", "batch", "rates", "paused"]) said(key).textContent = "";
    said("since").textContent = "(give the checkpoint to read whether it runs)";
    link.hidden = true;
    return;
  }
  // the state as read_run checked it: a killed process's file still says running
  const paused = run.paused;
  state.textContent = paused ? `${run.state}, paused` : run.state;
  state.className = `state ${paused ? "paused" : run.state.replace(" ", "-")}`;
  said("paused").textContent = paused
    ? `· sink ${paused.sink} unreachable since ${whenFull(paused.since_ms)} (${paused.error}):`
      + ` a batch waits, no record is charged, next try within ${paused.retry_s} s`
    : "";
  const started = `started ${whenFull(run.started_ms)}`;
  said("since").textContent = run.state === "stopped"
    ? `${run.stopped_ms ? `at ${whenFull(run.stopped_ms)}` : `after ${whenFull(run.heard_ms)}, when last heard`}`
      + ` (${started})${run.error ? `: ${run.error}` : ""}`
    : run.state === "not responding"
      ? `since ${whenFull(run.heard_ms)} (${started})`
      : `since ${whenFull(run.started_ms)}, last heard ${when(run.heard_ms)}`;
  const b = run.last_batch;
  said("batch").textContent = (b ? `· last batch ${b.id} took ${ms(b.duration_ms)} (${fmt(b.rows)} rows)` : "· no batch yet")
    + (run.read === null || run.read === undefined ? "" : ` · ${fmt(run.read)} read since it started`);
  const rate = (v) => (v === null || v === undefined ? "–" : `${Number(v).toFixed(1)}/s`);
  said("rates").textContent = b ? `· input ${rate(b.input_per_s)} · processed ${rate(b.processed_per_s)}` : "";
  link.hidden = !run.spark_ui;
  if (run.spark_ui) link.href = run.spark_ui;
}

function drawStages(el, t) {
  const s = t.status, counts = s.stages || {};
  const failed = s.failed_by_stage || {}, rejected = s.rejected_by_stage || {};
  const reasons = { ...(s.rejected_reasons || {}) };
  for (const [stage, r] of Object.entries(s.failed_reasons || {})) reasons[stage] = { ...(reasons[stage] || {}), ...r };
  const kinds = t.graph.kinds || {};
  el.querySelector(".stages-span").textContent = s.stages_since_ms
    ? `tuples and roots since the checkpoint began, ${whenFull(s.stages_since_ms)}`
    : "roots since the channel began (no checkpoint given)";
  const body = el.querySelector("table.stages tbody");
  body.replaceChildren();
  const declared = t.graph.nodes.filter((n) => n !== "spout");
  const names = [...new Set([...declared, ...Object.keys(counts), ...Object.keys(failed), ...Object.keys(rejected)])];
  for (const name of names) {
    const row = body.insertRow();
    row.dataset.stage = name;
    cell(row, name);
    cell(row, kinds[name] || (declared.includes(name) ? "" : "not a stage"), "kind");
    cell(row, fmt(counts[name]?.in), "n in");
    cell(row, fmt(counts[name]?.out), "n out");
    cell(row, fmt(failed[name] || 0), "n failed");
    cell(row, fmt(rejected[name] || 0), "n rejected");
    cell(row, s.held && s.held[name] ? fmt(s.held[name].tuples) : "", "n held");
    cell(row, Object.entries(reasons[name] || {}).map(([r, n]) => `${r} (${fmt(n)})`).join("; "), "reasons");
  }
  // the declared graph as a Sankey diagram: tuples flow along the edges when counted
  // (else every edge is drawn alike), what a stage read and did not emit leaves it
  const counted = Object.keys(counts).length > 0;
  const nodes = [...t.graph.nodes];
  const index = (n) => (nodes.includes(n) ? nodes.indexOf(n) : nodes.push(n) - 1);
  const link = { source: [], target: [], value: [], color: [] };
  const add = (a, b, v, color) => {
    if (!v) return;
    link.source.push(index(a)); link.target.push(index(b)); link.value.push(v); link.color.push(color);
  };
  for (const [a, b] of t.graph.edges)
    add(a, b, counted ? (a === "spout" ? counts[b]?.in : counts[a]?.out ?? counts[b]?.in) || 0 : 1, "#4c6ef544");
  if (counted)
    for (const [stage, c] of Object.entries(counts))
      if (c.out !== undefined && c.in > c.out) add(stage, "stopped here", c.in - c.out, "#c92a2a55");
  const plot = el.querySelector(".plot.graph");
  plot.dataset.nodes = JSON.stringify(t.graph.nodes);
  if (!link.value.length) {
    plot.textContent = "no stage graph: give the topology's checkpoint";
    plot.style.height = "auto";
    return;
  }
  plot.style.height = `${Math.max(220, 40 * nodes.length)}px`;
  if (plot.textContent && !plot.data) plot.textContent = "";
  Plotly.react(plot, [{
    type: "sankey", arrangement: "snap", valueformat: counted ? ",d" : "",
    node: { label: nodes, pad: 24, thickness: 14 }, link,
  }], {
    margin: { l: 5, r: 5, t: counted ? 5 : 22, b: 5 },
    annotations: counted ? [] : [{ text: "declared graph (no tuple counts: Topology(stage_counts=True) keeps them)",
      showarrow: false, x: 0, y: 1.08, xref: "paper", yref: "paper", xanchor: "left", font: { size: 11, color: "#667" } }],
  }, CONFIG);
}

function drawTimes(el, s) {
  // acked, failed, timed out and rejected roots are disjoint (one each, as the cards
  // count them): stacked bars, none hidden behind another; replayed and dead-lettered
  // are what became of the failed ones: lines with markers over them
  const h = s.history || [];
  const x = h.map((b) => new Date(b.t_ms));
  const width = h.length ? h[0].bin_s : 1;
  const span = `over the channel's history, bins of ${width} s`;
  el.querySelector(".rates-span").textContent = span;
  el.querySelector(".latency-span").textContent = span;
  const bar = (key, name) => ({ x, y: h.map((b) => b[key] || 0), name, type: "bar", marker: { color: COLORS[key] } });
  const line = (key, name) => ({
    x, y: h.map((b) => b[key] || 0), name, mode: "lines+markers", line: { color: COLORS[key], dash: "dot" },
    marker: { size: 5 },
  });
  const axis = TIME_AXIS(`completion time (bins of ${width} s)`);
  Plotly.react(el.querySelector(".plot.rates"),
    [bar("acked", "acked"), bar("failed", "failed"), bar("timed_out", "timed out"), bar("rejected", "rejected"),
      line("replayed", "replayed"), line("dead_lettered", "dead-lettered")],
    { ...LAYOUT, barmode: "stack", bargap: 0.05, xaxis: axis, yaxis: { title: { text: "roots/s" }, rangemode: "tozero" } }, CONFIG);
  // rings of decreasing size: a bin's percentiles of one root coincide, none hides another
  const size = { p50: 11, p90: 7, p99: 4 };
  const pct = (key) => ({
    x, y: h.map((b) => b[key]), name: key, mode: "lines+markers", connectgaps: false, marker: { size: size[key] },
  });
  Plotly.react(el.querySelector(".plot.latency"), [pct("p50"), pct("p90"), pct("p99")],
    { ...LAYOUT, xaxis: axis, yaxis: { title: { text: "ms" }, rangemode: "tozero" } }, CONFIG);
}

function drawLag(el, s) {
  const names = [], lags = [], body = el.querySelector("table.partitions tbody");
  body.replaceChildren();
  for (const [topic, parts] of Object.entries(s.partitions || {}))
    for (const [p, m] of Object.entries(parts)) {
      const name = `${topic}[${p}]`;
      names.push(name); lags.push(m.lag);
      const row = body.insertRow();
      row.dataset.partition = name;
      cell(row, name); cell(row, fmt(m.end), "n end"); cell(row, fmt(m.committed), "n committed"); cell(row, fmt(m.lag), "n lag");
    }
  Plotly.react(el.querySelector(".plot.lag"), [{ type: "bar", x: names, y: lags, marker: { color: "#1971c2" } }],
    { ...LAYOUT, hovermode: "closest", yaxis: { title: { text: "offsets" }, rangemode: "tozero" } }, CONFIG);
}

function drawLetters(el, t) {
  const d = t.dead_letters;
  el.querySelector(".letters-count").textContent = d.count === null ? "" : `(${fmt(d.count)})`;
  el.querySelector(".letters-where").textContent = d.error ? `could not read them: ${d.error}` : `in ${d.where}`;
  const body = el.querySelector("table.dead-letters tbody");
  body.replaceChildren();
  const at = (tMs) => (tMs === null || tMs === undefined ? "" : whenFull(tMs));
  for (const r of d.rows) {
    const row = body.insertRow();
    row.dataset.letter = r.letter;
    cell(row, `${r.topic}[${r.partition}]@${r.offset}`);
    cell(row, at(r.written_ms), "died");
    cell(row, at(r.timestamp_ms), "time");
    cell(row, r.key ?? "", "key");
    cell(row, r.value ?? "", "value");
    cell(row, r.attempts, "n");
    cell(row, r.reason || "", "reason");
    cell(row, r.replayed_ms ? when(r.replayed_ms) : "", "replayed");
    const button = document.createElement("button");
    button.textContent = "Replay";
    button.className = "replay";
    button.disabled = !t.can_replay;
    button.addEventListener("click", () => replay(t.name, [r.letter]));
    row.insertCell().appendChild(button);
  }
  const waiting = d.rows.filter((r) => !r.replayed_ms).map((r) => r.letter);
  const all = el.querySelector(".replay-all");
  all.dataset.letters = JSON.stringify(waiting);
  all.disabled = !t.can_replay || !waiting.length;
}

async function replay(topology, letters) {
  const what = letters.length === 1 ? `the dead letter ${letters[0]}` : `${letters.length} dead letters`;
  if (!confirm(`Replay ${what} of ${topology}? Each record is sent again to its source topic.`)) return;
  const answer = await fetch("/api/replay", {
    method: "POST",
    headers: {
      "content-type": "application/json",
      // the server's token, written into the page: only the page itself may replay
      "x-ackstream-token": document.querySelector('meta[name="ackstream-token"]').content,
    },
    body: JSON.stringify({ topology, letters, confirmed: true }),
  });
  const said = await answer.json();
  document.getElementById("said").textContent = answer.ok
    ? `replayed ${said.replayed} of ${topology}` : `replay failed: ${said.error}`;
  load();
}

function replayAll(el) {
  replay(el.dataset.name, JSON.parse(el.querySelector(".replay-all").dataset.letters || "[]"));
}

async function load() {
  let data;
  try {
    data = await (await fetch("/api/topologies", { cache: "no-store" })).json();
  } catch (error) {
    document.getElementById("read").textContent = `could not read: ${error}`;
    return;
  }
  document.title = data.title;
  for (const t of data.topologies) {
    const el = section(t.name);
    const error = el.querySelector(".error");
    error.hidden = !t.error;
    error.textContent = t.error ? `last read failed: ${t.error}` : "";
    if (!t.status) continue;
    el.querySelector(".channel").textContent = t.status.channel;
    for (const [key, text] of Object.entries(figures(t.status)))
      el.querySelector(`[data-figure="${key}"]`).textContent = text;
    drawRun(el, t);
    drawStages(el, t);
    drawTimes(el, t.status);
    drawLag(el, t.status);
    drawLetters(el, t);
  }
  document.getElementById("read").textContent = `read at ${when(data.read_ms)}, every ${EVERY_MS / 1000} s`;
  document.body.dataset.loaded = String(data.read_ms);
}

load();
setInterval(load, EVERY_MS);
