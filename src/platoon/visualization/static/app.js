// platoon view: the page over the viewer's JSON API (or over an export's data files).
// Plain JS and SVG, no dependencies. Everything a run recorded is shown through textContent,
// never as HTML: agent output is untrusted.
"use strict";

const STATIC = !!window.PLATOON_STATIC;
const POLL_MS = 3000;
const state = { route: null, poll: null, lastPoll: null, selectedAgent: null, selectedCall: null, shade: "logprob" };

// --- data ------------------------------------------------------------------------------------

function dataKey(name, params) {
  const keys = Object.keys(params).filter((k) => params[k] !== undefined && params[k] !== "").sort();
  const query = keys.map((k) => k + "=" + params[k]).join("&");
  let out = "";
  for (const ch of name + "?" + query) {
    if (/[A-Za-z0-9-]/.test(ch)) out += ch;
    else out += "_" + ch.codePointAt(0).toString(16).padStart(2, "0");
  }
  return out;
}

window.__platoonData = window.__platoonData || {};

function loadStatic(name, params) {
  const key = dataKey(name, params);
  if (key in window.__platoonData) return Promise.resolve(window.__platoonData[key]);
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = "data/" + key + ".js";
    script.onload = () => (key in window.__platoonData ? resolve(window.__platoonData[key]) : reject(new Error("not in the export: " + name)));
    script.onerror = () => reject(new Error("this export does not hold " + name + " " + JSON.stringify(params)));
    document.head.appendChild(script);
  });
}

async function api(name, params = {}) {
  if (STATIC) return loadStatic(name, params);
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== "") query.set(k, v);
  const response = await fetch("api/" + name + "?" + query.toString(), { cache: "no-store" });
  let body;
  try { body = await response.json(); } catch (e) { throw new Error(`${name}: the server answered ${response.status} without JSON`); }
  if (!response.ok) throw new Error(body.error || `${name}: ${response.status}`);
  return body;
}

// --- DOM helpers -----------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) el.setAttribute(k, v);
  for (const child of children.flat(Infinity)) if (child) el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return v.toLocaleString("en-US").replace(/,/g, " ");
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
  return v.toFixed(digits).replace(/\.?0+$/, "") || "0";
}
function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "–"; }
function pill(text, cls) { return h("span", { class: "pill " + (cls || text || "") }, text ?? "–"); }
function link(route, params, ...children) { return h("a", { href: href(route, params) }, ...children); }
function href(route, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const qs = q.toString();
  return "#/" + route + (qs ? "?" + qs : "");
}
function problems(list) {
  if (!list || !list.length) return null;
  return h("ul", { class: "problems", "data-testid": "problems" }, list.map((p) => h("li", {}, p)));
}
function crumbs(...parts) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...parts.flatMap((p, i) => (i ? [h("span", { class: "sep" }, "›"), p] : [p])));
}
const tooltip = () => document.getElementById("tooltip");
function showTip(event, text) {
  const tip = tooltip();
  tip.textContent = text;
  tip.hidden = false;
  const x = Math.min(event.clientX + 14, window.innerWidth - 430);
  tip.style.left = x + "px";
  tip.style.top = event.clientY + 14 + "px";
}
function hideTip() { tooltip().hidden = true; }

// --- plots -----------------------------------------------------------------------------------

const COLORS = ["#2f6fdb", "#d2553b", "#1f8a4c", "#8a63d2", "#b7791f", "#0e8a9a", "#c2407a", "#5b6470"];

// Smoothing of curves: an exponential moving average, debiased so that it starts at the first
// value (TensorBoard's). 0: off. Kept across pages and reloads.
const SMOOTHING = [0, 0.6, 0.8, 0.9, 0.95, 0.99];
function remembered(key) { try { return localStorage.getItem(key); } catch (e) { return null; } }
function remember(key, value) { try { localStorage.setItem(key, value); } catch (e) { /* a page from disk may not keep it */ } }
state.smooth = SMOOTHING.includes(Number(remembered("platoon.smooth"))) ? Number(remembered("platoon.smooth")) : 0;

function smoothed(points, weight) {
  let last = 0;
  return points.map((p, i) => {
    last = last * weight + (1 - weight) * p[1];
    return [p[0], last / (1 - Math.pow(weight, i + 1))];
  });
}

function smoothingControl(redraw) {
  return h("label", { class: "smoothing" }, "smoothing ",
    h("select", { "data-testid": "smoothing", onchange: (e) => { state.smooth = Number(e.target.value); remember("platoon.smooth", String(state.smooth)); redraw(); } },
      SMOOTHING.map((w) => h("option", { value: w, selected: w === state.smooth }, w ? String(w) : "off"))));
}

// Axis ticks at round values (1, 2 or 5 times a power of ten), labelled with just the digits
// that tell them apart: never "-0" twice.
function niceStep(span, count) {
  const raw = span / count;
  const magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / magnitude;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
}

function tickText(v, step) {
  if (Math.abs(v) < step / 2) return "0";
  const places = Math.floor(Math.log10(step) + 1e-9);
  if (step < 1e-3 || Math.abs(v) >= 1e6) return v.toExponential(Math.min(6, Math.max(0, Math.floor(Math.log10(Math.abs(v)) + 1e-9) - places)));
  return v.toFixed(Math.max(0, -places));
}

// series: [{name, points: [[x, y]...], color, band: [[x, lo, hi]...]}]
function plot(title, series, { xLabel = "step" } = {}) {
  const W = 420, H = 210, L = 48, R = 10, T = 8, B = 26;
  const all = series.flatMap((ser) => ser.points);
  const bands = series.flatMap((ser) => ser.band || []);
  const card = h("div", { class: "card plot", "data-plot": title });
  card.appendChild(h("div", { class: "title" }, title));
  if (!all.length) { card.appendChild(h("p", { class: "muted" }, "no values")); return card; }
  const xs = all.map((p) => p[0]);
  const ys = all.map((p) => p[1]).concat(bands.flatMap((b) => [b[1], b[2]]));
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const counts = ys.every((y) => y >= 0); // a count, a time, a rate: the axis stays at or above 0
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const pad = (y1 - y0) * 0.06; y0 -= pad; y1 += pad;
  if (counts) y0 = Math.max(0, y0);
  const yStep = niceStep(y1 - y0, 4);
  y0 = Math.floor(y0 / yStep) * yStep; y1 = Math.ceil(y1 / yStep) * yStep;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  for (let i = 0; y0 + i * yStep <= y1 + yStep / 2; i++) {
    const y = y0 + i * yStep;
    svg.appendChild(s("line", { x1: L, x2: W - R, y1: Y(y), y2: Y(y), stroke: "#eceef1" }));
    svg.appendChild(s("text", { class: "ytick", x: L - 4, y: Y(y) + 4, "text-anchor": "end", "font-size": 10, fill: "#6b7078" }, tickText(y, yStep)));
  }
  // Steps are integers: tick at whole steps, as many as fit.
  const every = Math.max(1, Math.ceil((x1 - x0) / 8));
  for (let x = Math.ceil(x0 / every) * every; x <= x1; x += every) {
    svg.appendChild(s("text", { class: "xtick", x: X(x), y: H - 8, "text-anchor": "middle", "font-size": 10, fill: "#6b7078" }, fmt(x)));
  }
  const weight = state.smooth;
  series.forEach((ser, i) => {
    const color = ser.color || COLORS[i % COLORS.length];
    if (ser.band && ser.band.length > 1) {
      const top = ser.band.map((b) => `${X(b[0])},${Y(b[2])}`);
      const bottom = ser.band.slice().reverse().map((b) => `${X(b[0])},${Y(b[1])}`);
      svg.appendChild(s("polygon", { points: top.concat(bottom).join(" "), fill: color, opacity: 0.15 }));
    }
    const pts = ser.points.slice().sort((a, b) => a[0] - b[0]);
    const smooth = weight > 0 && pts.length > 2 ? smoothed(pts, weight) : null;
    const line = (points, attrs) => s("polyline", { points: points.map((p) => `${X(p[0])},${Y(p[1])}`).join(" "), fill: "none", stroke: color, "stroke-width": 1.8,
      "data-series": ser.name, "data-values": JSON.stringify(points.map((p) => p[1])), ...attrs });
    if (pts.length > 1) svg.appendChild(line(pts, smooth ? { opacity: 0.3, "stroke-width": 1.2 } : {}));
    if (pts.length <= 200) for (const p of pts) svg.appendChild(s("circle", { cx: X(p[0]), cy: Y(p[1]), r: smooth ? 1.6 : 2.4, fill: color, opacity: smooth ? 0.4 : 1 }));
    if (smooth) { ser.smooth = smooth; svg.appendChild(line(smooth, { "data-smoothed": weight })); }
  });
  const cursor = s("line", { y1: T, y2: H - B, stroke: "#999", "stroke-dasharray": "3 3", visibility: "hidden" });
  svg.appendChild(cursor);
  const hit = s("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "transparent" });
  hit.addEventListener("mousemove", (event) => {
    const box = svg.getBoundingClientRect();
    const x = x0 + ((event.clientX - box.left) * (W / box.width) - L) / (W - L - R) * (x1 - x0);
    let best = null;
    for (const v of xs) if (best === null || Math.abs(v - x) < Math.abs(best - x)) best = v;
    cursor.setAttribute("x1", X(best)); cursor.setAttribute("x2", X(best)); cursor.setAttribute("visibility", "visible");
    const lines = [`${xLabel} ${fmt(best)}`];
    for (const ser of series) {
      const p = ser.points.find((q) => q[0] === best);
      const sm = (ser.smooth || []).find((q) => q[0] === best);
      if (p) lines.push(`${ser.name}: ${fmt(p[1], 4)}` + (sm ? ` (smoothed ${fmt(sm[1], 4)})` : ""));
      const b = (ser.band || []).find((q) => q[0] === best);
      if (b) lines.push(`  spread ${fmt(b[1], 3)} … ${fmt(b[2], 3)}`);
    }
    showTip(event, lines.join("\n"));
  });
  hit.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); hideTip(); });
  svg.appendChild(hit);
  card.appendChild(svg);
  if (series.length > 1 || series[0].name !== title)
    card.appendChild(h("div", { class: "legend" }, series.map((ser, i) => h("span", {}, h("i", { style: `background:${ser.color || COLORS[i % COLORS.length]}` }), ser.name))));
  return card;
}

function pointsOf(rows, key) {
  return rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);
}

// The policies of a run with several: each reports `<policy>/policy/version` every step, and its
// own training metrics under its name (`planner/train/loss`).
function policiesOf(rows) {
  const found = new Set();
  for (const r of rows) for (const k of Object.keys(r)) if (k.endsWith("/policy/version") && k.split("/").length === 3) found.add(k.split("/")[0]);
  return [...found].sort();
}

// A metric's keys in a run: its own, then each policy's.
function variants(keys, policies, key) {
  return [key, ...policies.map((p) => p + "/" + key)].filter((k) => keys.has(k));
}

// What the run page plots, in order; every other metric follows under "all metrics".
const PANELS = [
  { title: "reward", keys: ["reward/mean"], band: ["reward/mean", "reward/std"] },
  { title: "pass rate", keys: ["reward/pass_rate"] },
  { title: "eval", prefix: "eval/", match: /pass@|reward|success|rate/, limit: 8 },
  { title: "step time (s)", keys: ["time/step", "time/rollout", "time/credit", "time/train", "time/sampler_refresh"] },
  { title: "tokens", keys: ["train/trained_tokens", "credit/input_tokens", "credit/trained_tokens"] },
  { title: "datums", keys: ["train/datums", "credit/datums"] },
  { title: "staleness", keys: ["staleness/mean", "staleness/max", "staleness/dropped_datums"] },
  { title: "loss", keys: ["train/loss"] },
  { title: "loss per token", keys: ["train/loss_per_token", "sft/heldout_loss"] },
  // the learning signal's health (docs/reference/health.md)
  { title: "sampler-trainer mismatch", keys: ["mismatch/max_abs", "mismatch/mean_abs", "mismatch/kl"] },
  { title: "importance ratio", keys: ["ratio/max", "ratio/mean", "ratio/min"] },
  { title: "clipped and cut (share)", keys: ["ratio/clipped_fraction", "correction/truncated_fraction", "correction/masked_fraction", "replies/truncated_fraction"] },
  { title: "entropy (nats a token)", keys: ["entropy/mean"] },
  { title: "grad norm", keys: ["train/grad_norm"] },
  { title: "tokens per datum", keys: ["train/tokens_per_datum", "train/trained_tokens_per_datum"] },
];

function metricPanels(rows) {
  const keys = new Set(rows.flatMap((r) => Object.keys(r)).filter((k) => k !== "step" && k !== "time"));
  const policies = policiesOf(rows);
  const used = new Set();
  const cards = [];
  for (const panel of PANELS) {
    let ks = panel.keys ? panel.keys.flatMap((k) => variants(keys, policies, k)) : [...keys].filter((k) => k.startsWith(panel.prefix)).sort();
    if (panel.match) ks = ks.filter((k) => panel.match.test(k));
    if (panel.limit) ks = ks.filter((k) => k.split("/").length <= 3).slice(0, panel.limit);
    if (!ks.length) continue;
    ks.forEach((k) => used.add(k));
    const series = ks.map((k) => ({ name: k, points: pointsOf(rows, k) }));
    if (panel.band && keys.has(panel.band[1])) {
      const [m, sd] = panel.band;
      series[0].band = rows.filter((r) => typeof r[m] === "number" && typeof r[sd] === "number").map((r) => [r.step, r[m] - r[sd], r[m] + r[sd]]);
      used.add(sd);
    }
    cards.push(plot(panel.title, series));
  }
  const rest = [...keys].filter((k) => !used.has(k)).sort();
  return { cards, rest };
}

// --- pages -----------------------------------------------------------------------------------

const main = () => document.getElementById("main");
function setMain(...nodes) { main().replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false)); }

async function pageRuns() {
  crumbs(h("span", {}, "runs"));
  const data = await api("runs");
  const body = [h("h1", {}, "Runs"), data.root ? h("p", { class: "muted" }, "under " + data.root) : null];
  if (!data.runs.length) {
    body.push(h("p", { class: "problems" }, "No runs here yet. Train one (platoon train CONFIG), then reload; or name a run directory: platoon view RUN_DIR."));
    setMain(...body);
    return;
  }
  const chosen = new Set();
  const compare = h("button", { class: "act", disabled: true, onclick: () => { location.hash = href("compare", { runs: [...chosen].join(",") }); } }, "compare selected");
  const rows = data.runs.map((run) => h("tr", { class: "clickable", "data-run": run.id, onclick: (e) => { if (e.target.tagName !== "INPUT") location.hash = href("run", { run: run.id }); } },
    h("td", {}, h("input", { type: "checkbox", onchange: (e) => { e.target.checked ? chosen.add(run.id) : chosen.delete(run.id); compare.disabled = chosen.size < 2; } })),
    h("td", {}, run.experiment), h("td", {}, link("run", { run: run.id }, run.trial)),
    h("td", {}, pill(run.status)), h("td", { class: "num" }, fmt(run.steps)), h("td", { class: "num" }, fmt(run.episodes)),
    h("td", { class: "num" }, fmt(run.last_reward)), h("td", {}, when(run.started)),
    h("td", { class: "muted" }, run.problems.length ? "⚠ " + run.problems[0] : "")));
  body.push(h("table", { "data-testid": "runs" },
    h("thead", {}, h("tr", {}, ["", "experiment", "trial", "status", "steps", "episodes", "last reward", "started", ""].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows)));
  if (!STATIC) body.push(h("p", {}, compare));
  setMain(...body);
}

async function pageCompare(params) {
  const ids = (params.get("runs") || "").split(",").filter(Boolean);
  crumbs(link("", {}, "runs"), h("span", {}, "compare"));
  const all = await Promise.all(ids.map((id) => api("metrics", { run: id }).catch((e) => ({ run: id, rows: [], problems: [e.message] }))));
  // A run of several policies reports its training metrics under each policy's name
  // (`planner/train/loss`): a metric is offered once, and plotted for every run and policy.
  const runs = all.map((m) => ({ ...m, policies: policiesOf(m.rows), keys: new Set(m.rows.flatMap((r) => Object.keys(r))) }));
  const base = (run, k) => { const [head, ...rest] = k.split("/"); return run.policies.includes(head) && rest.length > 1 ? rest.join("/") : k; };
  const keys = [...new Set(runs.flatMap((run) => [...run.keys].map((k) => base(run, k))))].filter((k) => k !== "step" && k !== "time").sort();
  const preferred = ["reward/mean", "reward/pass_rate", "train/trained_tokens", "time/step", "staleness/mean", "train/loss"].filter((k) => keys.includes(k));
  const grid = h("div", { class: "grid", "data-testid": "plots" });
  let chosen = preferred.length ? preferred : keys.slice(0, 4);
  const series = (k) => runs.flatMap((run, i) => variants(run.keys, run.policies, k).map((key, j) => ({
    name: key === k ? run.run : `${run.run} · ${key.split("/")[0]}`, points: pointsOf(run.rows, key),
    color: COLORS[(i + j * runs.length) % COLORS.length] })));
  const draw = () => grid.replaceChildren(...chosen.map((k) => plot(k, series(k))));
  const select = h("select", { multiple: true, size: 6, onchange: () => { chosen = [...select.selectedOptions].map((o) => o.value); draw(); } },
    keys.map((k) => h("option", { value: k, selected: chosen.includes(k) }, k)));
  setMain(h("h1", {}, "Compare " + ids.join(" · ")), h("div", { class: "filters" }, h("label", {}, "metrics", select), smoothingControl(draw)),
    ...all.map((m) => problems(m.problems)), grid);
  draw();
}

async function pageRun(params) {
  const runId = params.get("run");
  const [run, metrics, steps] = await Promise.all([api("run", { run: runId }), api("metrics", { run: runId }), api("steps", { run: runId })]);
  crumbs(link("", {}, "runs"), h("span", {}, run.experiment + " / " + run.trial));
  const { cards, rest } = metricPanels(metrics.rows);
  const plots = h("div", { class: "grid", "data-testid": "plots" }, cards);
  const restGrid = h("div", { class: "grid" });
  const drawRest = () => restGrid.replaceChildren(...rest.map((k) => plot(k, [{ name: k, points: pointsOf(metrics.rows, k) }])));
  const restBox = h("details", {}, h("summary", {}, `all metrics (${rest.length} more)`), restGrid);
  restBox.addEventListener("toggle", () => { if (restBox.open && !restGrid.children.length) drawRest(); });
  const redraw = () => { plots.replaceChildren(...metricPanels(metrics.rows).cards); if (restBox.open) drawRest(); };
  const stepRows = steps.steps.map((st) => h("tr", { class: "clickable", "data-step": st.step, "data-purpose": st.purpose, onclick: () => { location.hash = href("step", { run: runId, purpose: st.purpose, step: st.step }); } },
    h("td", {}, st.purpose), h("td", { class: "num" }, link("step", { run: runId, purpose: st.purpose, step: st.step }, st.step)),
    h("td", { class: "num" }, fmt(st.episodes)), h("td", { class: "num" }, fmt(st.graded)), h("td", { class: "num" }, fmt(st.reward_mean)),
    h("td", { class: "num" }, fmt(st.reward_min)), h("td", { class: "num" }, fmt(st.reward_max)), h("td", { class: "num" }, fmt(st.rewarded)),
    h("td", { class: "num" }, fmt(st.completion_tokens)), h("td", { class: "num" }, st.in_flight ? fmt(st.in_flight) : "")));
  const lockText = run.lock ? JSON.stringify(run.lock, null, 2) : run.lock_problem || "no lock.json";
  setMain(
    h("h1", {}, run.experiment + " / " + run.trial, " ", pill(run.status)),
    h("p", { class: "muted" }, run.path, " · started ", when(run.started), " · ", fmt(run.steps), " steps · ", fmt(run.episodes), " episodes · log ", fmt(Math.round(run.log_bytes / 1024)), " KiB"),
    problems(run.problems.concat(metrics.problems || [])),
    run.failures && run.failures.length ? h("details", {}, h("summary", {}, `${run.failures.length} component failures`), h("pre", {}, run.failures.map((f) => f.component + ": " + f.error).join("\n"))) : null,
    h("h2", {}, "Metrics"),
    cards.length ? [h("div", { class: "filters" }, smoothingControl(redraw)), plots] : h("p", { class: "muted" }, "no metrics yet"),
    rest.length ? restBox : null,
    h("h2", {}, "Steps"),
    steps.steps.length ? h("table", { "data-testid": "steps" }, h("thead", {}, h("tr", {}, ["split", "step", "episodes", "graded", "mean reward", "min", "max", "rewarded", "tokens", "in flight"].map((t) => h("th", { title: t === "step" ? STEP_HINT : undefined }, t)))), h("tbody", {}, stepRows)) : h("p", { class: "muted" }, "no episodes yet"),
    h("h2", {}, "Config"),
    h("details", {}, h("summary", {}, "config.yaml"), h("pre", { "data-testid": "config" }, run.config || "no config.yaml")),
    h("details", {}, h("summary", {}, "lock.json"), h("pre", { "data-testid": "lock" }, lockText)),
  );
}

const STEP_HINT = "train step N is the Nth optimizer step (from 1); an eval at step N evaluates the policy after N steps (0: the base model)";

const COLUMNS = [
  ["reward", "reward"], ["status", "status"], ["task_id", "task"], ["env", "env"], ["harness", "harness"], ["depth", "depth"],
  ["policy_version", "version"], ["calls", "calls"], ["tool_calls", "tools"], ["completion_tokens", "sampled tokens"],
  ["duration_s", "seconds"], ["group_id", "group"],
];

async function pageStep(params) {
  const runId = params.get("run"), purpose = params.get("purpose") || "train", step = params.get("step");
  const [run, list, steps] = await Promise.all([api("run", { run: runId }), api("episodes", { run: runId, purpose, step }), api("steps", { run: runId })]);
  crumbs(link("", {}, "runs"), link("run", { run: runId }, run.experiment + " / " + run.trial), h("span", {}, `${purpose} step ${step}`));
  const facets = steps.facets || {};
  const f = { sort: params.get("sort") || "reward", order: params.get("order") || "desc" };
  for (const k of ["status", "env", "harness", "depth", "policy_version", "task", "min_reward", "max_reward"]) f[k] = params.get(k) || "";
  const update = () => { location.hash = href("step", { run: runId, purpose, step, ...f }); };
  const choice = (key, label) => h("label", {}, label, h("select", { "data-filter": key, onchange: (e) => { f[key] = e.target.value; update(); } },
    h("option", { value: "" }, "any"), (facets[key] || []).map((v) => h("option", { value: v, selected: String(v) === f[key] }, v))));
  const text = (key, label, size) => h("label", {}, label, h("input", { "data-filter": key, value: f[key], size: size || 8, onchange: (e) => { f[key] = e.target.value.trim(); update(); } }));
  let rows = list.episodes.filter((e) =>
    (!f.status || e.status === f.status) && (!f.env || e.env === f.env) && (!f.harness || e.harness === f.harness) &&
    (!f.depth || String(e.depth) === f.depth) && (!f.policy_version || String(e.policy_version) === f.policy_version) &&
    (!f.task || (e.task_id || "").includes(f.task)) &&
    (f.min_reward === "" || (e.reward !== null && e.reward >= +f.min_reward)) && (f.max_reward === "" || (e.reward !== null && e.reward <= +f.max_reward)));
  state.live = !list.episodes.length || list.episodes.some((e) => !e.status || (e.reward === null && !e.grade_reason));
  const dir = f.order === "asc" ? 1 : -1;
  rows = rows.slice().sort((a, b) => {
    const x = a[f.sort], y = b[f.sort];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
  const head = h("tr", {}, COLUMNS.map(([key, label]) => h("th", { class: f.sort === key ? "sorted" + (f.order === "asc" ? " asc" : "") : "", onclick: () => { f.order = f.sort === key && f.order === "desc" ? "asc" : "desc"; f.sort = key; update(); } }, label)));
  const body = rows.map((e) => h("tr", { class: "clickable", "data-episode": e.episode_id, onclick: (ev) => { if (ev.target.tagName !== "A") location.hash = href("episode", { run: runId, id: e.episode_id }); } },
    h("td", { class: "num", "data-reward": e.reward ?? "" }, fmt(e.reward)), h("td", {}, pill(e.status || "in flight", e.status || "running")),
    h("td", {}, link("episode", { run: runId, id: e.episode_id }, e.task_id || e.episode_id.slice(0, 8))), h("td", {}, e.env), h("td", {}, e.harness),
    h("td", { class: "num" }, fmt(e.depth)), h("td", { class: "num" }, fmt(e.policy_version)), h("td", { class: "num" }, fmt(e.calls)), h("td", { class: "num" }, fmt(e.tool_calls)),
    h("td", { class: "num" }, fmt(e.completion_tokens)), h("td", { class: "num" }, fmt(e.duration_s, 2)),
    h("td", {}, link("group", { run: runId, group: e.group_id }, (e.group_id || "").slice(0, 8)))));
  setMain(
    h("h1", {}, `${purpose} step ${step}`, h("span", { class: "muted" }, ` · ${rows.length} of ${list.total} episodes`)),
    h("div", { class: "filters" }, text("min_reward", "reward ≥", 5), text("max_reward", "reward ≤", 5), choice("status", "status"), choice("env", "environment"),
      choice("harness", "harness"), text("task", "task contains", 10), choice("depth", "depth"), choice("policy_version", "policy version")),
    h("table", { "data-testid": "episodes" }, h("thead", {}, head), h("tbody", {}, body)));
}

async function pageGroup(params) {
  const runId = params.get("run"), group = params.get("group");
  const [run, list] = await Promise.all([api("run", { run: runId }), api("episodes", { run: runId, group_id: group })]);
  const first = list.episodes[0] || {};
  crumbs(link("", {}, "runs"), link("run", { run: runId }, run.experiment + " / " + run.trial),
    link("step", { run: runId, purpose: first.purpose, step: first.step }, `${first.purpose} step ${first.step}`), h("span", {}, "group " + (group || "").slice(0, 8)));
  const episodes = await Promise.all(list.episodes.map((e) => api("episode", { run: runId, id: e.episode_id })));
  state.live = list.episodes.some((e) => !e.status);
  setMain(
    h("h1", {}, `Group of ${first.task_id || "?"}`, h("span", { class: "muted" }, ` · ${episodes.length} episodes, best first`)),
    h("div", { class: "side", "data-testid": "group" }, episodes.map((ep) => {
      const root = ep.agents.find((a) => !a.parent_id) || ep.agents[0];
      return h("div", { class: "card" },
        h("h3", {}, link("episode", { run: runId, id: ep.episode.episode_id }, "reward " + fmt(ep.episode.reward)), " ", pill(ep.episode.status)),
        h("p", { class: "muted" }, `${fmt(ep.episode.calls)} calls · ${fmt(ep.episode.completion_tokens)} sampled tokens`),
        root ? root.items.filter((i) => i.kind === "tool" || i.kind === "model_call").map((i) => turnSummary(i)) : null);
    })));
}

function turnSummary(item) {
  if (item.kind === "tool") return h("div", { class: "msg" }, h("span", { class: "role" }, "tool " + item.name + " "), h("code", {}, JSON.stringify(item.arguments)), " → ", h("span", {}, (item.output || item.error || "").slice(0, 200)));
  const text = item.reply ? (item.reply.content || "") + (item.reply.tool_calls ? " " + item.reply.tool_calls.map((c) => `${c.function?.name}(${c.function?.arguments})`).join(" ") : "") : item.completion_text || "";
  return h("div", { class: "msg" }, h("span", { class: "role" }, "assistant "), h("span", {}, text.slice(0, 300)));
}

function messageBlock(m) {
  const calls = (m.tool_calls || []).map((c) => h("pre", {}, `→ ${c.function?.name}(${typeof c.function?.arguments === "string" ? c.function.arguments : JSON.stringify(c.function?.arguments)})`));
  return h("div", { class: "msg" }, h("div", { class: "role" }, m.role + (m.name ? " " + m.name : "")), m.content ? h("pre", {}, m.content) : null, calls, m.reasoning_content ? h("details", {}, h("summary", {}, "reasoning"), h("pre", {}, m.reasoning_content)) : null);
}

function turn(item, ctx) {
  const t = (x) => (x ? h("span", { class: "muted" }, fmt(x, 2) + " s") : null);
  if (item.kind === "model_call") {
    const selected = ctx.call === item.call_id;
    const el = h("div", { class: "turn model_call" + (selected ? " selected" : ""), "data-call": item.call_id || "", onclick: () => { if (item.call_id) ctx.select(item.call_id); } },
      h("div", { class: "head" }, h("b", {}, "model call"), item.call_kind && item.call_kind !== "policy" ? pill(item.call_kind) : null,
        h("span", { "data-testid": "call-tokens" }, `${fmt(item.prompt_tokens)} prompt + ${fmt(item.completion_tokens)} sampled tokens`),
        h("span", { class: "muted" }, "v" + fmt(item.policy_version)), h("span", { class: "muted" }, item.stop_reason || item.finish_reason || ""), t(item.duration_s),
        item.context_reset ? h("span", { class: "reset" }, "⟲ context reset (new datum)") : null,
        item.error ? pill("error: " + item.error, "bad") : null),
      item.messages ? h("details", { onclick: (e) => e.stopPropagation() }, h("summary", {}, `prompt: ${item.messages.length} messages`), item.messages.map(messageBlock)) : h("div", { class: "muted" }, "messages not recorded (an HTTP agent): see the prompt text below"),
      item.reply ? messageBlock(item.reply) : item.completion_text ? h("pre", {}, item.completion_text) : null,
      item.parse_errors && item.parse_errors.length ? h("div", { class: "reset" }, "parse errors: " + item.parse_errors.join("; ")) : null);
    if (selected) el.appendChild(ctx.tokensBox);
    return el;
  }
  if (item.kind === "tool") {
    return h("div", { class: "turn tool" }, h("div", { class: "head" }, h("b", {}, "tool " + item.name), item.reward !== null && item.reward !== undefined ? h("span", {}, "reward " + fmt(item.reward)) : null,
      item.finished ? pill("finished", "good") : null, item.env_fault ? pill("env fault", "bad") : null, item.error ? pill("error", "bad") : null, t(item.duration_s)),
      h("pre", {}, JSON.stringify(item.arguments, null, 1)), h("pre", { class: "tool-output", "data-testid": "tool-output" }, item.output ?? item.error ?? "(no answer recorded)"));
  }
  if (item.kind === "grade") {
    return h("div", { class: "turn grade" }, h("div", { class: "head" }, h("b", {}, "grader"), h("span", {}, "reward " + fmt(item.reward))),
      item.rewards && Object.keys(item.rewards).length ? h("pre", {}, JSON.stringify(item.rewards, null, 1)) : null, item.reason ? h("pre", {}, item.reason) : null, item.error ? h("pre", {}, item.error) : null);
  }
  if (item.kind === "process") {
    return h("div", { class: "turn process" }, h("div", { class: "head" }, h("b", {}, "agent process"), h("span", {}, "exit " + fmt(item.return_code)), item.timed_out ? pill("timed out", "bad") : null, t(item.duration_s)),
      item.error ? h("pre", {}, item.error) : null,
      h("details", {}, h("summary", {}, `stdout (${fmt(item.stdout_bytes)} bytes)`), h("pre", {}, item.stdout || "")),
      h("details", {}, h("summary", {}, `stderr (${fmt(item.stderr_bytes)} bytes)`), h("pre", {}, item.stderr || "")));
  }
  if (item.kind === "session") {
    return h("div", { class: "turn session" }, h("div", { class: "head" }, h("b", {}, "env session"), item.fork_of ? h("span", { class: "muted" }, `${item.fork} fork of ${item.fork_of.slice(0, 8)}`) : null,
      h("span", { class: "muted" }, "tools: " + (item.tools || []).map((x) => x.name).join(", "))), item.error ? h("pre", {}, item.error) : null,
      item.instruction ? h("details", {}, h("summary", {}, "instruction"), h("pre", {}, item.instruction)) : null);
  }
  return h("div", { class: "turn" }, JSON.stringify(item));
}

// A number that may be tiny (a float32 rounding) or not: exponent notation only when it is.
function small(x) { return x === 0 || Math.abs(x) >= 1e-3 ? x.toFixed(4) : x.toExponential(2); }

// The trainer's logprob of a token less the sampler's (null where the trainer gave none).
function mismatchOf(tok) {
  return typeof tok.trainer_logprob === "number" && typeof tok.logprob === "number" ? tok.trainer_logprob - tok.logprob : null;
}

function tokenColor(tok, mode) {
  if (mode === "entropy") { // -logprob: the surprise of the sampled token, in nats (5 nats and more: darkest)
    const nats = tok.logprob === null || tok.logprob === undefined ? 0 : -tok.logprob;
    return `rgba(40,110,200,${Math.min(1, nats / 5) * 0.75})`;
  }
  if (mode === "mismatch") { // |trainer - sampler| on a log scale: 1e-7 faint, 1e-1 and more darkest; 0 clear
    const m = mismatchOf(tok);
    if (m === null) return "transparent";
    const a = Math.abs(m);
    return a === 0 ? "transparent" : `rgba(140,60,190,${0.1 + 0.65 * Math.max(0, Math.min(1, (Math.log10(a) + 7) / 6))})`;
  }
  if (mode === "advantage") {
    if (!tok.weight) return "transparent";
    const a = Math.max(-1, Math.min(1, tok.advantage || 0)); // the rollout's advantage, not the scaled one
    return a >= 0 ? `rgba(31,138,76,${0.12 + 0.6 * a})` : `rgba(194,59,59,${0.12 + 0.6 * -a})`;
  }
  const p = tok.logprob === null || tok.logprob === undefined ? 1 : Math.exp(tok.logprob);
  return `rgba(230,120,40,${(1 - p) * 0.75})`; // unlikely tokens are darker
}

function tokensView(data) {
  const box = h("div", { "data-testid": "tokens", "data-token-count": data.tokens.length, "data-trained": data.trained_tokens });
  const draw = () => {
    const spans = data.tokens.map((tok, i) => h("span", {
      class: "tok" + (tok.weight ? "" : " masked"), "data-i": i, "data-id": tok.id, "data-logprob": tok.logprob, "data-mismatch": mismatchOf(tok) ?? "", "data-advantage": tok.advantage ?? "", "data-trained-advantage": tok.trained_advantage ?? "", "data-weight": tok.weight ?? "",
      style: `background:${tokenColor(tok, state.shade)};border-bottom-color:${tok.weight ? (tok.advantage > 0 ? "#1f8a4c" : tok.advantage < 0 ? "#c23b3b" : "#999") : "transparent"}`,
      onmousemove: (e) => showTip(e, `token ${tok.id} ${JSON.stringify(tok.text ?? "")}\nlogprob ${fmt(tok.logprob, 4)} (p ${fmt(Math.exp(tok.logprob ?? 0), 3)})` +
        (tok.position !== undefined ? `\ndatum position ${tok.position}\nadvantage ${fmt(tok.advantage, 4)} (trained as ${fmt(tok.trained_advantage, 4)} a token)\nweight ${fmt(tok.weight)} (${tok.weight ? "trained" : "masked"})\ndatum logprob ${fmt(tok.datum_logprob, 4)}` : "\nnot in any datum") +
        (mismatchOf(tok) !== null ? `\ntrainer logprob ${fmt(tok.trainer_logprob, 6)}\nmismatch (trainer - sampler) ${small(mismatchOf(tok))}` : "")),
      onmouseleave: hideTip }, tok.text ?? `[${tok.id}]`));
    tokenBox.replaceChildren(...spans);
  };
  const tokenBox = h("div", { class: "tokens" });
  const HINTS = {
    logprob: " darker = less likely under the sampler",
    entropy: " darker = more surprising (-logprob, in nats): where the sampler was unsure",
    advantage: " green = positive advantage, red = negative; struck through = masked (weight 0)",
    mismatch: " darker = the trainer's logprob further from the sampler's (log scale, 1e-7 to 0.1); clear = equal or not trained",
  };
  const hint = h("span", { class: "muted" }, HINTS[state.shade]);
  const tabs = h("span", { class: "tabs" }, ["logprob", "entropy", "advantage", "mismatch"].map((m) => h("button", { class: state.shade === m ? "on" : "", onclick: (e) => { e.stopPropagation(); state.shade = m; [...tabs.children].forEach((b) => b.classList.toggle("on", b.textContent === m)); hint.textContent = HINTS[m]; draw(); } }, m)));
  const d = data.datum;
  const advs = d ? d.advantages.map((a) => fmt(a, 4)).join(", ") : null;
  const scaled = d ? normalization(d) : null;
  // where the sampler and the trainer disagree most
  let worst = null;
  data.tokens.forEach((tok, i) => { const m = mismatchOf(tok); if (m !== null && (worst === null || Math.abs(m) > Math.abs(worst.m))) worst = { i, m, tok }; });
  const scoredNote = worst === null ? null : h("p", { class: "muted", "data-testid": "mismatch" }, worst.m === 0
    ? "trainer and sampler logprobs equal on every trained token"
    : `largest sampler-trainer mismatch: ${small(worst.m)} at token ${worst.i} ${JSON.stringify(worst.tok.text ?? String(worst.tok.id))}`);
  box.append(...[
    h("h3", {}, `Sampled tokens (${data.tokens.length}, ${data.trained_tokens} trained)`),
    h("p", {}, "shade by ", tabs, hint),
    d ? h("p", { "data-testid": "datum" }, `datum ${d.index} of step ${d.step}: ${fmt(d.length)} tokens, ${fmt(d.num_trained_tokens)} trained, policy version ${d.policy_version}, advantage ${advs}`)
      : h("p", { class: "problems" }, data.untrained_reason || "not trained"),
    scaled ? h("p", { class: "muted", "data-testid": "normalization" }, scaled) : null,
    scoredNote,
    data.tokenizer_error ? h("p", { class: "muted" }, "token ids shown as numbers: " + data.tokenizer_error) : null,
    tokenBox,
    h("details", { onclick: (e) => e.stopPropagation() }, h("summary", {}, `prompt (${data.prompt_ids.length} tokens)`), h("pre", {}, data.prompt_text ?? data.prompt_ids.join(" ")))].filter(Boolean));
  draw();
  return box;
}

// How credit scaled the rollout's advantage into what the loss used, said apart from it.
function normalization(d) {
  const parts = [];
  if (d.depth_weight !== 1) parts.push(`× ${fmt(d.depth_weight, 4)} (the weight of depth ${d.depth})`);
  if (d.normalization === "token_mean") parts.push(`÷ ${fmt(d.batch_tokens)} (loss_normalization token_mean: the trained tokens of step ${d.step}'s batch)`);
  const trained = d.trained_advantages.map((a) => fmt(a, 4)).join(", ");
  if (!parts.length) return d.normalization ? `trained as is (loss_normalization ${d.normalization}): ${trained} a token` : `trained as ${trained} a token (the run's lock.json does not say its loss_normalization)`;
  return `normalisation: advantage ${parts.join(" ")} = ${trained} a token, as trained`;
}

async function pageEpisode(params) {
  const runId = params.get("run"), id = params.get("id");
  const [run, ep] = await Promise.all([api("run", { run: runId }), api("episode", { run: runId, id })]);
  const e = ep.episode;
  state.live = !e.status || !ep.graded;
  crumbs(link("", {}, "runs"), link("run", { run: runId }, run.experiment + " / " + run.trial),
    link("step", { run: runId, purpose: e.purpose, step: e.step }, `${e.purpose} step ${e.step}`), h("span", {}, "episode " + id.slice(0, 8)));
  const agentIds = ep.agents.map((a) => a.agent_id);
  let agentId = params.get("agent");
  if (!agentIds.includes(agentId)) agentId = ep.roots[0] || agentIds[0];
  const callId = params.get("call");
  const byId = Object.fromEntries(ep.agents.map((a) => [a.agent_id, a]));
  const go = (extra) => { location.hash = href("episode", { run: runId, id, agent: agentId, call: callId, ...extra }); };
  const node = (a) => h("li", {}, h("div", { class: a.agent_id === agentId ? "selected" : "", "data-agent": a.agent_id, onclick: () => go({ agent: a.agent_id, call: undefined }) },
    h("b", {}, a.parent_id ? "subagent" : "root"), " ", h("span", { class: "muted" }, a.harness || ""), " ",
    a.policy && a.policy !== "default" ? h("span", { class: "muted" }, `policy ${a.policy} `) : "", pill(a.status || "running", a.status || "running"),
    a.reward !== null && a.reward !== undefined ? h("span", {}, " r=" + fmt(a.reward)) : null,
    h("div", { class: "muted" }, `depth ${a.depth} · ${a.items.filter((i) => i.kind === "model_call").length} calls · ${a.items.filter((i) => i.kind === "tool").length} tools`),
    a.fork ? h("div", { class: "fork" }, `${a.fork.mode} fork of ${a.fork.of.slice(0, 8)}`) : null,
    a.items.some((i) => i.context_reset) ? h("div", { class: "fork" }, "compacted (context reset)") : null),
    a.children.length ? h("ul", {}, a.children.map((c) => node(byId[c]))) : null);
  const agent = byId[agentId];
  const tokensBox = h("div", {}, h("p", { class: "muted" }, "loading tokens…"));
  const ctx = { call: callId, select: (c) => go({ call: c === callId ? undefined : c }), tokensBox };
  const grade = ep.graded || {};
  const fin = ep.finished || {};
  setMain(
    h("h1", {}, `Episode ${e.task_id || ""}`, " ", pill(e.status || "in flight", e.status || "running")),
    h("dl", { class: "kv card", "data-testid": "episode-head" },
      h("dt", {}, "reward"), h("dd", { "data-testid": "reward" }, fmt(e.reward)),
      grade.rewards && Object.keys(grade.rewards).length ? [h("dt", {}, "rewards"), h("dd", {}, JSON.stringify(grade.rewards))] : null,
      Object.entries(grade.notes || {}).map(([part, note]) => [h("dt", {}, part), h("dd", { "data-testid": "note" }, h("details", {}, h("summary", {}, "reasoning"), h("pre", {}, note)))]),
      h("dt", {}, "task"), h("dd", {}, `${e.env} · ${e.split} · ${e.task_id}`),
      h("dt", {}, "step"), h("dd", {}, `${e.purpose} step ${e.step} · policy version ${e.policy_version} · attempt ${e.attempt ?? 0}`),
      h("dt", {}, "calls"), h("dd", {}, `${fmt(e.calls)} model calls · ${fmt(e.tool_calls)} tool calls · ${fmt(e.prompt_tokens)} prompt + ${fmt(e.completion_tokens)} sampled tokens`),
      h("dt", {}, "time"), h("dd", {}, `${when(e.requested_at)} · ${fmt(e.duration_s, 2)} s`),
      e.reason || fin.reason ? [h("dt", {}, "reason"), h("dd", {}, e.reason || fin.reason)] : null,
      grade.reason ? [h("dt", {}, "grade"), h("dd", {}, grade.reason)] : null,
      fin.final_message ? [h("dt", {}, "final message"), h("dd", {}, h("pre", {}, fin.final_message))] : null,
      h("dt", {}, "group"), h("dd", {}, link("group", { run: runId, group: e.group_id }, `the group's ${ep.group.length} episodes side by side`), " · rewards ", ep.group.map((g) => fmt(g.reward)).join(", "))),
    h("div", { class: "episode" },
      h("div", { class: "tree card", "data-testid": "tree" }, h("h3", {}, "Agents"), h("ul", {}, ep.roots.map((r) => node(byId[r])))),
      h("div", { "data-testid": "timeline" }, agent ? [h("h3", {}, (agent.parent_id ? "Subagent " : "Root agent ") + agent.agent_id.slice(0, 8)), agent.instruction ? h("details", {}, h("summary", {}, "instruction"), h("pre", {}, agent.instruction)) : null,
        agent.items.map((i) => turn(i, ctx)), agent.final_message ? h("div", { class: "turn" }, h("b", {}, "final message"), h("pre", {}, agent.final_message)) : null]
        : h("p", { class: "muted" }, "no agent recorded yet"))));
  if (callId) {
    try {
      tokensBox.replaceChildren(tokensView(await api("call", { run: runId, episode: id, call: callId })));
    } catch (err) { tokensBox.replaceChildren(h("p", { class: "error" }, err.message)); }
  }
}

// --- routing and live updates ----------------------------------------------------------------

const PAGES = { "": pageRuns, run: pageRun, step: pageStep, episode: pageEpisode, group: pageGroup, compare: pageCompare };

async function render(keepScroll) {
  const raw = location.hash.replace(/^#\/?/, "");
  const [route, query] = raw.split("?");
  const params = new URLSearchParams(query || "");
  const page = PAGES[route] || pageRuns;
  const y = window.scrollY;
  state.live = true; // pages whose data can no longer change set it false
  // The change marker is read before the page's data: whatever is written after this read
  // differs from it, so the first poll sees it even if it lands before the page is drawn.
  const seen = STATIC ? null : await pollKey(params.get("run")).catch(() => null);
  try {
    await page(params);
    if (keepScroll) window.scrollTo(0, y);
    document.body.dataset.page = route || "runs";
    document.body.dataset.ready = String(Date.now());
  } catch (err) {
    setMain(h("h1", {}, "Cannot show this"), h("p", { class: "error", "data-testid": "error" }, err.message), h("p", {}, link("", {}, "all runs")));
    document.body.dataset.ready = String(Date.now());
  }
  schedulePoll(params.get("run"), seen);
}

async function pollKey(runId) {
  const now = runId ? await api("poll", { run: runId }) : (await api("runs")).runs.map((r) => [r.id, r.log_bytes, r.status]);
  return { key: JSON.stringify(now), status: runId ? now.status : null };
}

function schedulePoll(runId, seen) {
  clearTimeout(state.poll);
  const live = document.getElementById("live");
  if (STATIC) { live.textContent = "static export"; return; }
  state.lastPoll = seen ? seen.key : null;
  const tick = async () => {
    try {
      const { key, status } = await pollKey(runId);
      // A page whose data is final (a finished episode, a step with nothing in flight) is left
      // alone: redrawing it would close what the reader opened.
      if (state.lastPoll !== null && state.lastPoll !== key && state.live && !document.querySelector("input:focus, select:focus")) {
        state.lastPoll = key;
        await render(true);
        return;
      }
      state.lastPoll = key;
      live.textContent = status ? "● " + status : "● live";
    } catch (err) { live.textContent = "○ server unreachable"; }
    state.poll = setTimeout(tick, runId ? POLL_MS : POLL_MS * 3); // the runs table reads every run
  };
  state.poll = setTimeout(tick, 10);
}

window.addEventListener("hashchange", () => render(false));
render(false);
