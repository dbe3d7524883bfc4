// finetwin dashboard: reads the /v1 API with the key the user entered (kept in this browser's
// localStorage); approving or rejecting asks for an approver key each time (in a dialog whose key field does
// not echo) and does not keep it.
"use strict";

const KEY_STORAGE = "finetwin.apiKey";
// The scheduling policy the twin assumes the cluster runs (FINETWIN_FORECAST_POLICY): it shapes the queue.
const POLICY_NAMES = {
  fifo: "FIFO",
  backfill: "EASY backfill",
  spf: "shortest-predicted-first",
  conservative: "conservative backfill",
};
const REFRESH_MS = 15000;
const JOBS_SHOWN = 50;
// Why the API refused the last key (401), until another is entered: polling on with it would count against
// this address's failed key checks (429 past 30 a minute) and lock out the valid key entered next.
let refused = "";
const charts = {};
window.finetwinCharts = charts; // for tests and the curious: the Chart.js instances

function storedKey() { return localStorage.getItem(KEY_STORAGE) || ""; }

function setStatus(text, isError) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.className = isError ? "error" : "";
}

async function api(path, options = {}, key = storedKey()) {
  const headers = Object.assign(
    { "X-API-Key": key }, options.body ? { "Content-Type": "application/json" } : {}, options.headers || {},
  );
  const response = await fetch(path, Object.assign({}, options, { headers }));
  const body = response.headers.get("content-type")?.includes("json") ? await response.json() : null;
  if (!response.ok) {
    const error = new Error((body && body.detail) || `${response.status} ${response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function fillTable(id, rows, columns) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  for (const item of rows) {
    const tr = document.createElement("tr");
    for (const column of columns) column(tr, item);
    body.appendChild(tr);
  }
}

const fmt = (x, digits = 2) => (x === null || x === undefined || Number.isNaN(x) ? "-" : Number(x).toFixed(digits));
// Times as the telemetry states them (UTC), with the zone said: the cluster's clock, not this browser's.
const when = (ts) => (ts ? new Date(ts).toLocaleString(undefined, { timeZone: "UTC", timeZoneName: "short" }) : "");

// --- cluster -----------------------------------------------------------------------------------------------

async function loadCluster() {
  const cluster = await api("/v1/cluster");
  // Which cluster this API serves: one store may hold several, each with its API and dashboard.
  document.getElementById("cluster-name").textContent = cluster.cluster_id;
  document.title = `finetwin · ${cluster.cluster_id}`;
  const summary = document.getElementById("cluster-summary");
  summary.replaceChildren();
  const gpusUp = cluster.pools.reduce((a, p) => a + p.gpus_up, 0);
  const gpusBusy = cluster.pools.reduce((a, p) => a + p.gpus_busy, 0);
  // Running jobs past their time limit (overdue) or silent past their last progress (stalled): said only
  // when there are some, in words of each kind.
  const attention = Object.entries(cluster.attention || {}).filter(([, n]) => n > 0);
  const needing = attention.reduce((a, [, n]) => a + n, 0);
  const numbers = [["nodes", cluster.nodes.length], ["GPUs up", gpusUp], ["GPUs busy", gpusBusy],
                   ["running", cluster.running], ["queued", cluster.queued]];
  if (needing) numbers.push([`need attention (${attention.map(([k, n]) => `${n} ${k}`).join(", ")})`, needing]);
  for (const [label, value] of numbers) {
    const span = document.createElement("span");
    const b = document.createElement("b");
    b.textContent = value;
    span.append(b, ` ${label}`);
    if (label.startsWith("need attention")) span.className = "attention";
    summary.appendChild(span);
  }
  fillTable("nodes", cluster.nodes, [
    (tr, n) => cell(tr, n.node_id), (tr, n) => cell(tr, n.gpu_model), (tr, n) => cell(tr, n.gpu_count),
    (tr, n) => cell(tr, n.status),
  ]);
  // The API lists newest first: the queued jobs' last page is those waiting longest, shown longest first, so
  // that past the limit those left out are the latest arrivals. (A job queued between the two reads shifts
  // that page by one until the next poll.)
  // The jobs that need attention first, whatever their age: the newest running ones may not include them.
  const [flagged, running, queued] = await Promise.all([
    needing ? api(`/v1/jobs?attention=any&limit=${JOBS_SHOWN}`) : { jobs: [], total: 0 },
    api(`/v1/jobs?state=running&limit=${JOBS_SHOWN}`),
    api(`/v1/jobs?state=submitted&limit=${JOBS_SHOWN}&offset=${Math.max(0, cluster.queued - JOBS_SHOWN)}`),
  ]);
  queued.jobs.reverse();
  const shown = (page, what) => (page.total > page.jobs.length
    ? `showing ${page.jobs.length} of ${page.total} ${what}` : `${page.total} ${what}`);
  document.getElementById("jobs-note").textContent = (flagged.total ? `${shown(flagged, "needing attention")}; ` : "") +
    `${shown(running, "running (newest first)")}; ${shown(queued, "queued (longest waiting first)")}`;
  const first = new Set(flagged.jobs.map((j) => j.job_id));
  const rows = flagged.jobs.concat(running.jobs.filter((j) => !first.has(j.job_id)), queued.jobs);
  fillTable("jobs", rows, [
    (tr, j) => cell(tr, j.job_id),
    (tr, j) => {
      if (!j.attention) { cell(tr, j.state); return; }
      const td = cell(tr, `${j.state}: ${j.attention.kind}`, "attention");
      td.title = j.attention.why;  // e.g. "no progress reported for 45 min: it may hang, holding its GPUs"
      td.setAttribute("aria-label", `${j.state}, ${j.attention.kind}: ${j.attention.why}`);
    },
    (tr, j) => cell(tr, j.model_name),
    (tr, j) => cell(tr, j.number_gpus), (tr, j) => cell(tr, j.batch_size), (tr, j) => cell(tr, when(j.submitted_at)),
  ]);
}

// --- charts ------------------------------------------------------------------------------------------------

function bandChart(name, canvasId, labels, spread, scale, y = {}) {
  const s = (values) => (values || []).map((v) => (v === null ? null : v * scale));
  const data = {
    labels,
    datasets: [
      { label: "p90", data: s(spread.p90), borderWidth: 0, pointRadius: 0, fill: "+1",
        backgroundColor: "rgba(31, 119, 180, 0.18)" },
      { label: "p10", data: s(spread.p10), borderWidth: 0, pointRadius: 0, fill: false },
      { label: "mean", data: s(spread.mean), borderColor: "rgb(31, 119, 180)", pointRadius: 0, fill: false },
    ],
  };
  draw(name, canvasId, "line", data, { plugins: { legend: { display: false } }, scales: { y } });
}

function draw(name, canvasId, type, data, options) {
  const base = { animation: false, responsive: true, maintainAspectRatio: false };
  const canvas = document.getElementById(canvasId);
  describeChart(canvas, type, data);
  if (charts[name]) {
    charts[name].data = data;
    charts[name].update();
    return;
  }
  charts[name] = new Chart(canvas, { type, data, options: Object.assign(base, options) });
}

// A chart is pixels: a screen reader found nothing in it. The canvas is an image whose label says what it
// shows, in words: its caption, then each line's first and last value and its range, or each bar's value.
function describeChart(canvas, type, data) {
  const caption = canvas.closest("figure")?.querySelector("figcaption")?.textContent || "chart";
  const number = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3).replace(/\.?0+$/, ""));
  const parts = [];
  // A band chart's datasets are p90, p10 and mean (then what happened): said the other way round.
  const datasets = type === "line" ? [...data.datasets].reverse() : data.datasets;
  for (const dataset of datasets) {
    const values = dataset.data.filter((v) => typeof v === "number" && Number.isFinite(v));
    if (type === "bar") {
      const bars = data.labels.map((label, i) => [label, dataset.data[i]]).filter(([, v]) => typeof v === "number");
      if (bars.length) parts.push(`${dataset.label}: ${bars.map(([l, v]) => `${l} ${number(v)}`).join(", ")}`);
    } else if (type === "scatter") {
      if (dataset.data.length) parts.push(`${dataset.label}: ${dataset.data.length} points`);
    } else if (values.length) {
      parts.push(`${dataset.label} from ${number(values[0])} to ${number(values[values.length - 1])}` +
        ` (lowest ${number(Math.min(...values))}, highest ${number(Math.max(...values))})`);
    }
  }
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", `${caption}: ${parts.length ? parts.join("; ") : "no data yet"}`);
}

async function loadForecast() {
  const f = await api("/v1/forecast");
  const hours = (f.series.t_s || []).map((t) => `+${(t / 3600).toFixed(0)}h`);
  const clock = f.clock && f.clock.source === "telemetry" ? "telemetry clock" : "wall clock";
  document.getElementById("forecast-meta").textContent =
    `${f.runs} runs, ${f.models}, ${POLICY_NAMES[f.policy] || f.policy} scheduling, ` +
    `${f.known_jobs ? f.known_jobs.total : 0} known jobs, ` +
    `${fmt(f.arrivals_per_day, 0)} arrivals/day; starts ${when(f.start)} (${clock}), ` +
    // Both ages, each with its clock: a replay at 600x makes seconds of wall time an hour of telemetry.
    `made ${age(f.age_s)} ago on the telemetry's clock, ${age(f.age_wall_s)} ago on the wall clock`;
  showForecastSummary(f.summary || {});
  bandChart("utilization", "chart-utilization", hours, f.series.utilization, 100, { min: 0, max: 100 });
  bandChart("queue", "chart-queue", hours, f.series.queue_length, 1, { min: 0 });
  const slos = f.slos || [];
  // An SLO with no value (no interval had anything to measure) is "no data", not a bar at 0 %.
  const measured = (s) => s.attainment.mean !== null && s.attainment.mean !== undefined;
  draw("slo", "chart-slo", "bar", {
    labels: slos.map((s) => (measured(s) ? s.name : `${s.name} (no data)`)),
    datasets: [
      { label: "mean attainment %", data: slos.map((s) => (measured(s) ? s.attainment.mean * 100 : null)),
        backgroundColor: "rgba(26, 127, 55, 0.6)" },
      { label: "p10-p90",
        data: slos.map((s) => (measured(s) ? [s.attainment.p10 * 100, s.attainment.p90 * 100] : null)),
        backgroundColor: "rgba(26, 127, 55, 0.2)" },
    ],
  }, { scales: { y: { min: 0, max: 100 } } });
}

// The forecast's headline numbers over its horizon (means across runs), utilization per GPU type among them.
function showForecastSummary(summary) {
  const pct = (figure) => (figure && figure.mean !== null && figure.mean !== undefined ? `${fmt(figure.mean * 100, 0)} %` : "no data");
  const num = (figure, digits = 0) => (figure && figure.mean !== null && figure.mean !== undefined ? fmt(figure.mean, digits) : "no data");
  const minutes = (figure) => (figure && figure.mean !== null && figure.mean !== undefined ? age(figure.mean) : "no data");
  const items = [
    ["utilization", pct(summary.utilization)], ["p95 wait", minutes(summary.wait_p95_s)],
    ["jobs completed", num(summary.jobs_completed)], ["runtime failures", pct(summary.runtime_failure_ratio)],
    ["energy kWh", num(summary.energy_kwh)],
  ];
  for (const [gpu, figure] of Object.entries(summary.utilization_by_type || {})) items.push([`${gpu} utilization`, pct(figure)]);
  const box = document.getElementById("forecast-summary");
  box.replaceChildren();
  for (const [label, value] of items) {
    const span = document.createElement("span");
    const b = document.createElement("b");
    b.textContent = value;
    span.dataset.figure = label;
    span.append(b, ` ${label}`);
    box.appendChild(span);
  }
}

// --- forecast against what happened ---------------------------------------------------------------------

// [figure, caption, scale]: each drawn as the stored forecast's band with the actual value over it.
const VS_FIGURES = [
  ["utilization", "Utilization %", 100], ["queue_length", "Queue length", 1], ["running_jobs", "Running jobs", 1],
  ["jobs_completed", "Jobs completed per interval", 1], ["jobs_failed", "Jobs failed per interval", 1],
  ["energy_kwh", "Energy per interval (kWh)", 1],
];

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.max(0, Math.round(seconds));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

function vsCanvas(name, caption) {
  const id = `chart-vs-${name}`;
  if (!document.getElementById(id)) {
    const figure = document.createElement("figure");
    const label = document.createElement("figcaption");
    label.textContent = `${caption}: forecast p10-p90 and mean, what happened (dots)`;
    const canvas = document.createElement("canvas");
    canvas.id = id;
    figure.append(label, canvas);
    document.getElementById("vs-charts").appendChild(figure);
  }
  return id;
}

async function loadVsActual() {
  let view;
  try {
    view = await api("/v1/forecast/vs-actual");
  } catch (error) {
    if (error.status !== 404) throw error;
    document.getElementById("vs-meta").textContent = "no stored forecast yet";
    return;
  }
  const skill = await api("/v1/forecast/skill");
  const total = view.t_s.length;
  const made = view.models === "fallback"
    ? "made before any model was calibrated (rough fallback numbers, no runtime failures)"
    : view.models ? `made with ${view.models}` : "";
  document.getElementById("vs-meta").textContent =
    `forecast #${view.forecast_id} from ${when(view.start)}${made ? `, ${made}` : ""}, ` +
    `${age(view.age_s)} old on the telemetry's clock; ${view.intervals_passed} of ${total} intervals have happened`;
  const parts = Object.entries(skill.figures)
    .filter(([name]) => VS_FIGURES.some(([f]) => f === name))
    .map(([name, s]) => {
      // WAPE (total error over total actual), not MAPE: a queue of 1 forecast as 3 would read 200 %.
      const error = s.wape === null ? "" : `, error ${Math.round(s.wape * 100)} % of actual`;
      // Against persistence (the interval before the forecast, forecast to go on): does the twin beat it?
      const score = s.skill_score;
      const versus = score === null || score === undefined ? ""
        : `, ${Math.round(Math.abs(score) * 100)} % ${score >= 0 ? "less" : "more"} error than persistence`;
      return `${name} ${Math.round(s.coverage * 100)} % inside p10-p90${error}${versus} (n ${s.n})`;
    });
  // The attainment this forecast gave each SLO over its horizon, and what the record says so far.
  const pct = (x) => `${Math.round(x * 100)} %`;
  const slos = (view.slos || []).map((s) => {
    const said = s.forecast && s.forecast.mean !== null
      ? `forecast ${pct(s.forecast.mean)} (${Math.round(s.forecast.p10 * 100)}-${pct(s.forecast.p90)})`
      : "no forecast";
    const happened = s.judged ? `so far ${pct(s.actual)} of ${s.judged} intervals` : "no interval with data yet";
    return `${s.name}: ${said}, ${happened}`;
  });
  document.getElementById("vs-slos").textContent = slos.length
    ? `This forecast's SLO attainment: ${slos.join("; ")}` : "";
  document.getElementById("vs-skill").textContent = skill.scored
    ? `Skill over ${skill.scored} scored forecasts: ${parts.join("; ")}`
    : "No forecast interval has been scored yet.";
  // Each SLO's forecasts read as the chance it holds in an interval, against whether it held (Brier: the
  // mean squared difference, 0 is perfect); beside always saying the share it held in, which only hindsight
  // knows, and against persistence (as in the interval before).
  const sloSkill = Object.entries(skill.slos || {}).map(([name, s]) => {
    const versus = s.brier_skill === null ? ""
      : `, ${Math.round(Math.abs(s.brier_skill) * 100)} % ${s.brier_skill >= 0 ? "better" : "worse"} than persistence`;
    return `${name}: forecast to hold in ${pct(s.forecast_share)} of ${s.n} intervals, held in ` +
      `${pct(s.held_share)}, Brier ${s.brier.toFixed(2)} (always ${pct(s.held_share)}, known in hindsight: ` +
      `${s.climatology_brier.toFixed(2)})${versus}`;
  });
  document.getElementById("slo-skill").textContent = sloSkill.length
    ? `The forecasts' SLOs against what happened: ${sloSkill.join("; ")}` : "";
  const hours = view.t_s.map((t) => `+${(t / 3600).toFixed(0)}h`);
  for (const [name, caption, scale] of VS_FIGURES) {
    const band = view.figures[name];
    if (!band) continue;
    const s = (values) => values.map((v) => (v === null ? null : v * scale));
    draw(`vs-${name}`, vsCanvas(name, caption), "line", {
      labels: hours,
      datasets: [
        { label: "p90", data: s(band.p90), borderWidth: 0, pointRadius: 0, fill: "+1",
          backgroundColor: "rgba(31, 119, 180, 0.18)" },
        { label: "p10", data: s(band.p10), borderWidth: 0, pointRadius: 0, fill: false },
        { label: "forecast mean", data: s(band.mean), borderColor: "rgb(31, 119, 180)", pointRadius: 0, fill: false },
        { label: "actual", data: s(band.actual), borderColor: "rgb(207, 34, 46)", backgroundColor: "rgb(207, 34, 46)",
          showLine: false, pointRadius: 3, clip: false },
      ],
    }, { plugins: { legend: { display: false } }, scales: { y: { min: 0 } } });
  }
}

// The SLOs in force, judged on what the store recorded over the last day (the forecast's attainment is to be
// read against it), each as the intervals it held in out of those with data.
async function loadSloActual() {
  const record = await api("/v1/slos/attainment?window=24h");
  const parts = record.slos.map((s) => {
    if (!s.judged) return `${s.name}: no data`;
    const met = s.held.filter((h) => h === true).length;
    return `${s.name}: met in ${met} of ${s.judged} intervals (${Math.round(s.attainment * 100)} %)`;
  });
  document.getElementById("slo-actual").textContent = parts.length
    ? `SLOs as they happened, the last 24 h of telemetry: ${parts.join("; ")}`
    : "No SLO declared.";
}

async function loadLiveError() {
  const live = await api("/v1/models/live-error?limit=200");
  // In time order (the API's is not), labelled in UTC as every other time on the page.
  const points = live.points.filter((p) => p.rolling_mdape !== null)
    .sort((a, b) => Date.parse(a.ended_at) - Date.parse(b.ended_at));
  document.getElementById("error-caption").textContent = "Live model error: rolling throughput MdAPE (UTC)" +
    (points.length ? "" : " (no finished job scored against its prediction yet)");
  draw("error", "chart-error", "line", {
    labels: points.map((p) => new Date(p.ended_at).toISOString().slice(11, 16)),
    datasets: [
      { label: "rolling MdAPE %", data: points.map((p) => p.rolling_mdape * 100), borderColor: "rgb(207, 34, 46)",
        pointRadius: 0 },
      { label: "threshold %", data: points.map(() => live.mdape_threshold * 100), borderColor: "rgb(110, 119, 129)",
        borderDash: [4, 4], pointRadius: 0 },
    ],
  }, { scales: { x: { ticks: { maxTicksLimit: 8 } }, y: { min: 0 } } });
}

// --- recommendations and audit -----------------------------------------------------------------------------

function effectText(r) {
  const effect = r.effect;
  if (r.kind === "capacity" && effect && effect.slos) {
    // A capacity plan's shape: the share of its runs meeting each SLO, against the share the plan asked for.
    const worst = Math.min(1, ...Object.values(effect.slos).map((s) => s.met_share));
    return `every SLO met in at least ${fmt(worst * 100, 0)} % of ${effect.runs} runs ` +
      `(the plan asked for ${fmt(effect.confidence * 100, 0)} %)`;
  }
  if (!effect || effect.mean === undefined) return "";
  const ci = effect.ci95 ? ` (${fmt(effect.ci95[0] * 100, 1)} to ${fmt(effect.ci95[1] * 100, 1)})` : "";
  const overall = `${effect.mean >= 0 ? "+" : ""}${fmt(effect.mean * 100, 1)} pts attainment${ci}`;
  const helps = effect.helps;
  if (!helps) return overall;
  const met = helps.probability_met_change;
  const chance = met ? `, chance it is met ${met >= 0 ? "+" : ""}${fmt(met * 100, 0)} pts` : "";
  return `helps "${helps.slo}": ${helps.attainment_change >= 0 ? "+" : ""}${fmt(helps.attainment_change * 100, 1)} ` +
    `pts of its intervals met${chance}; all SLOs ${overall}`;
}

// A steering action's cost is the GPU-hours a day it adds (negative: saves); a capacity plan's is what its
// whole cluster would use. One column, so each says which.
const costText = (r) => (r.kind === "capacity" ? `${fmt(r.cost, 0)} for the whole cluster`
  : `${r.cost >= 0 ? "+" : ""}${fmt(r.cost, 0)} added`);

// A key (and a comment) asked for in a dialog whose key field does not echo, unlike window.prompt's.
// comment: null (none asked), "optional" or "required". Resolves to {key, comment}, or null when cancelled.
function ask(title, comment = null) {
  const dialog = document.getElementById("ask");
  const [keyInput, commentInput, error] =
    ["ask-key", "ask-comment", "ask-error"].map((id) => document.getElementById(id));
  document.getElementById("ask-title").textContent = title;
  keyInput.value = commentInput.value = error.textContent = "";
  document.getElementById("ask-comment-label").hidden = comment === null;
  commentInput.placeholder = comment || "";
  dialog.showModal();
  return new Promise((resolve) => {
    const done = (answer) => { dialog.onclose = null; dialog.close(); resolve(answer); };
    document.getElementById("ask-form").onsubmit = (event) => {
      event.preventDefault();
      const key = keyInput.value.trim();
      const text = commentInput.value.trim();
      if (!key) error.textContent = "an API key is required";
      else if (comment === "required" && !text) error.textContent = "a comment is required";
      else done({ key, comment: text || null });
    };
    document.getElementById("ask-cancel").onclick = () => done(null);
    dialog.onclose = () => resolve(null); // Escape
  });
}

// One request at a time per button: a double click would send it twice.
async function whileBusy(button, work) {
  button.disabled = true;
  try {
    await work();
  } finally {
    button.disabled = false;
  }
}

const DONE = { approve: "approved", reject: "rejected" };

async function decide(id, verb) {
  const answer = await ask(`Approver API key to ${verb} this recommendation`,
    verb === "reject" ? "required" : "optional");
  if (!answer) return;
  try {
    await api(`/v1/recommendations/${encodeURIComponent(id)}/${verb}`,
      { method: "POST", body: JSON.stringify(answer.comment ? { comment: answer.comment } : {}) }, answer.key);
    setStatus(DONE[verb], false);
  } catch (error) {
    setStatus(`${verb} failed: ${error.message}`, true);
  }
  await Promise.allSettled([loadRecommendations(), loadAudit()]);
}

async function loadRecommendations() {
  const [page, steering] = await Promise.all([
    api("/v1/recommendations?limit=50"), api("/v1/recommendations/steering"),
  ]);
  const pending = page.recommendations.filter((r) => r.state === "pending").length;
  const last = steering.ran
    ? `Last steering run ${when(steering.at)}: ${steering.evaluated} candidates, ${steering.recommended} recommended.`
    : "";
  const note = pending && !steering.why_none ? last : `${last} ${steering.why_none || ""}`.trim();
  document.getElementById("steering-note").textContent = steering.under_way
    ? `${note} A steering run is under way (${underWayText(steering.under_way)}).`.trim() : note;
  fillTable("recs", page.recommendations, [
    (tr, r) => cell(tr, r.title),
    (tr, r) => cell(tr, effectText(r)),
    (tr, r) => cell(tr, costText(r)),
    (tr, r) => {
      const td = cell(tr, r.state + (r.published ? " (sent)" : ""), `state-${r.state}`);
      td.dataset.recommendation = r.id;
    },
    (tr, r) => {
      const td = cell(tr, "");
      if (r.state !== "pending") return;
      for (const verb of ["approve", "reject"]) {
        const button = document.createElement("button");
        button.textContent = verb;
        button.dataset.action = verb;
        button.dataset.recommendation = r.id;
        button.addEventListener("click", () => whileBusy(button, () => decide(r.id, verb)));
        td.appendChild(button);
      }
    },
  ]);
}

// An operator's POST: with the key in use, or, when that key may not (403), an operator key asked for.
// Null when the user cancels.
async function asOperator(path, what, headers = {}) {
  try {
    return await api(path, { method: "POST", headers });
  } catch (error) {
    if (error.status !== 403) throw error;
    const answer = await ask(`Operator API key to ${what}`);
    return answer && api(path, { method: "POST", headers }, answer.key);
  }
}

const underWayText = (run) => `started ${when(run.started_at)} by ${run.actor}`;
// How often the page looks whether the steering run it started has finished (it takes about 40 s).
const STEERING_POLL_MS = 2000;

// The run goes on in the API's background (Prefer: respond-async answers 202 at once): the page follows it
// at the address the answer gives, so a proxy's timeout or a reload of the page loses nothing.
async function runSteering() {
  const result = document.getElementById("steering-run-result");
  result.textContent = "steering…";
  let started;
  try {
    started = await asOperator("/v1/recommendations/run", "run steering now", { Prefer: "respond-async" });
  } catch (error) {
    result.textContent = `steering could not run: ${error.message}`;
    return;
  }
  if (!started) { result.textContent = ""; return; }
  let last = started;
  while (last.under_way) {
    result.textContent = `steering… (${underWayText(last.under_way)}` +
      `${started.joined ? ", already under way" : ""})`;
    await new Promise((resolve) => setTimeout(resolve, STEERING_POLL_MS));
    try {
      last = await api(started.poll);
    } catch (error) {
      result.textContent = `steering under way; its outcome could not be read: ${error.message}`;
      return;
    }
  }
  result.textContent = last.ran
    ? `steering evaluated ${last.evaluated} actions, recommended ${last.recommended}` +
      (last.notes && last.notes.length ? ` (${last.notes.join("; ")})` : "")
    : `steering did not run: ${last.why_none}`;
  await Promise.allSettled([loadRecommendations(), loadAudit()]);
}
const steeringButton = document.getElementById("steering-run");
steeringButton.addEventListener("click", () => whileBusy(steeringButton, runSteering));

async function loadAudit() {
  const page = await api("/v1/audit?limit=50");
  fillTable("audit-log", page.entries, [
    (tr, e) => cell(tr, when(e.ts)), (tr, e) => cell(tr, e.actor),
    (tr, e) => cell(tr, e.subject, "wrap-anywhere"),  // recommendation:<uuid>
    (tr, e) => cell(tr, e.from_state), (tr, e) => cell(tr, e.to_state),
    (tr, e) => cell(tr, e.reason, "wrap-anywhere"),  // a comment may be one long URL
  ]);
}

async function loadReport() {
  const latest = await api("/v1/reports/latest");
  const p = document.getElementById("report-link");
  // Said only once the store has answered: before a key, the page does not know whether there is one.
  document.getElementById("report-none").hidden = latest.available;
  p.replaceChildren();
  if (!latest.available) return;
  const a = document.createElement("a");
  a.href = latest.url;
  a.textContent = `Latest report (${latest.generated_at || "undated"})`;
  p.appendChild(a);
}

// --- capacity plan -----------------------------------------------------------------------------------------

const nodesText = (nodes) => Object.entries(nodes).map(([gpu, n]) => `${n} x ${gpu}`).join(", ");
const weakest = (s) => (s.error || s.unplaceable_share ? 0
  : Math.min(1, ...Object.values(s.slos).map((x) => x.met_share)));

async function recommendPlan(id) {
  try {
    const made = await asOperator(`/v1/plan/${encodeURIComponent(id)}/recommend`, "recommend the cheapest");
    if (!made) return;
    setStatus(`recommended: ${made.title}`, false);
  } catch (error) {
    setStatus(`recommend failed: ${error.message}`, true);
  }
  await Promise.allSettled([loadRecommendations(), loadAudit()]);
}

async function loadPlan() {
  const plans = await api("/v1/plan");
  const latest = plans.find((p) => p.status === "done");
  const running = plans.find((p) => p.status === "running" || p.status === "queued");
  const meta = document.getElementById("plan-meta");
  // The newest plan's failure (an error, a stop, an API process lost mid-sweep) is said, not left unseen
  // behind the last plan that finished.
  const failed = plans.length && plans[0].status === "failed" ? `latest sweep failed: ${plans[0].error}` : "";
  meta.textContent = running ? `sweep running: ${running.progress.done}/${running.progress.total} tasks` : failed;
  document.getElementById("plan-empty").hidden = Boolean(latest); // said once the store has answered
  if (!latest) return;
  const plan = (await api(`/v1/plan/${encodeURIComponent(latest.id)}`)).result;
  document.getElementById("plan-result").hidden = false; // an empty chart and table until there is a plan
  meta.textContent = `${plan.scenarios.length} scenarios x ${plan.runs} runs on ${plan.executor}, ` +
    `confidence ${fmt(plan.confidence * 100, 0)} %` + (meta.textContent ? `; ${meta.textContent}` : "");
  const isCheapest = (s) => plan.cheapest && JSON.stringify(s) === JSON.stringify(plan.cheapest);
  fillTable("plan-scenarios", plan.scenarios, [
    (tr, s) => { cell(tr, isCheapest(s) ? "cheapest" : s.frontier ? "frontier" : ""); tr.dataset.frontier = s.frontier; },
    (tr, s) => cell(tr, nodesText(s.nodes)), (tr, s) => cell(tr, s.policy), (tr, s) => cell(tr, s.admission),
    (tr, s) => cell(tr, s.error ? `failed: ${s.error}` : `${fmt(weakest(s) * 100, 0)} %`),
    (tr, s) => cell(tr, fmt(s.gpu_hours_per_day, 0)), (tr, s) => cell(tr, fmt(s.energy_kwh_per_day, 0)),
    (tr, s) => cell(tr, s.meets_slos ? "yes" : "no", s.meets_slos ? "state-approved" : ""),
  ]);
  const point = (s) => ({ x: s.gpu_hours_per_day, y: weakest(s) * 100 });
  const frontier = plan.scenarios.filter((s) => s.frontier).map(point).sort((a, b) => a.x - b.x);
  draw("plan", "chart-plan", "scatter", {
    datasets: [
      { label: "frontier", data: frontier, showLine: true, borderColor: "rgb(26, 127, 55)", pointRadius: 4 },
      { label: "scenarios", data: plan.scenarios.map(point), backgroundColor: "rgba(110, 119, 129, 0.5)" },
    ],
  }, { scales: { x: { title: { display: true, text: "GPU-hours per day" } },
                 y: { min: 0, max: 100, title: { display: true, text: "% runs, weakest SLO" } } } });
  const button = document.getElementById("plan-recommend");
  button.hidden = !plan.cheapest;
  button.onclick = () => whileBusy(button, () => recommendPlan(latest.id));
}

// --- wiring ------------------------------------------------------------------------------------------------

async function loadAll() {
  const key = storedKey();
  if (!key) {
    setStatus(refused || "enter an API key to see the cluster", true);
    return;
  }
  const parts = { cluster: loadCluster, forecast: loadForecast, "forecast vs actual": loadVsActual,
                  "SLOs as they happened": loadSloActual, "model error": loadLiveError,
                  recommendations: loadRecommendations, audit: loadAudit, report: loadReport,
                  "capacity plan": loadPlan };
  const results = await Promise.allSettled(Object.values(parts).map((load) => load()));
  const failed = Object.keys(parts).filter((_, i) => results[i].status === "rejected");
  const unauthorized = results.find((r) => r.status === "rejected" && r.reason.status === 401);
  if (unauthorized && storedKey() === key) { // not a key entered while this load was on its way
    // Forgotten, so that neither the next poll nor a reload sends it again; what is shown is marked stale.
    localStorage.removeItem(KEY_STORAGE);
    document.querySelector("main").classList.add("stale");
    refused = `the API refused the key (${unauthorized.reason.message}): enter a valid key; ` +
      "the panels show what it saw before";
    setStatus(refused, true);
  } else if (failed.length) {
    const first = results.find((r) => r.status === "rejected").reason;
    setStatus(`could not load ${failed.join(", ")}: ${first.message}`, true);
  } else {
    setStatus(`updated ${new Date().toLocaleTimeString()}`, false);
  }
  document.body.dataset.loaded = String(Date.now());
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("key-input");
  if (input.value) localStorage.setItem(KEY_STORAGE, input.value.trim());
  input.value = "";
  refused = "";
  document.querySelector("main").classList.remove("stale");
  // Until every panel has answered, not the "enter an API key" of the page before the key.
  setStatus("loading…", false);
  loadAll();
});

loadAll();
setInterval(loadAll, REFRESH_MS);
