"use strict";
const B = document.body.dataset;
const EXPORT = B.mode === "export";
const REFRESH_MS = Number(B.refresh) * 1000;
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#bf3989", "#6e7781"];
const $ = (sel, root) => (root || document).querySelector(sel);
function esc(text) { return String(text == null ? "" : text).replace(/[&<>"']/g,
  c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]); }
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) if (value != null) node.setAttribute(key, value);
  for (const child of children.flat()) if (child != null) node.append(child instanceof Node ? child : String(child));
  return node;
}
function embedded() { const node = document.getElementById("data"); return node ? JSON.parse(node.textContent) : null; }
async function api(path) {
  const answer = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  const body = await answer.json();
  if (!answer.ok) throw new Error(body.error || ("HTTP " + answer.status));
  return body;
}
function runHref(name) { return EXPORT ? B.base + "run/" + encodeURIComponent(name) + ".html" : "/run/" + encodeURIComponent(name); }
function pipelineHref(runId) { return EXPORT ? B.base + "pipeline/" + encodeURIComponent(runId) + ".html" : "/pipeline/" + encodeURIComponent(runId); }
function pipelineLink(link) { return el("a", {class: "pipeline-link", href: pipelineHref(link.run)}, `pipeline ${link.run} · job ${link.job}`); }
function compareHref(names) {
  const query = names.map(name => "run=" + encodeURIComponent(name)).join("&");
  return EXPORT ? B.base + "compare.html?" + query : "/compare?" + query;
}
// Every value the page shows comes worded from the server (rayjobs_agent/wording.py); only a chart's ticks, which
// are worked out here, are worded here.
function tick(value) { return typeof value === "number" ? (Number.isInteger(value) ? String(value) : value.toPrecision(4).replace(/\.?0+$/, "")) : String(value); }
function badge(status) { return el("span", {class: "status s-" + status, "data-status": status}, status); }
function fail(error) { $("main").prepend(el("p", {class: "cause", id: "error"}, String(error.message || error))); }

// ---- charts: inline SVG, drawn here, no library
function extent(values) { let low = Math.min(...values), high = Math.max(...values);
  if (low === high) { low -= Math.abs(low) * 0.1 || 1; high += Math.abs(high) * 0.1 || 1; } return [low, high]; }
// Ticks a person reads at a glance: steps of 1, 2 or 5 times a power of ten, the range widened to whole steps.
function niceTicks(low, high, wanted) {
  const raw = (high - low) / wanted, power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * power).find(s => s >= raw) || 10 * power;
  const first = Math.floor(low / step) * step, last = Math.ceil(high / step) * step, ticks = [];
  for (let v = first; v <= last + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}
function chart(title, series, xLabel) {
  const W = 420, H = 230, L = 58, R = 12, T = 10, Bt = 34;
  const figure = el("figure", {class: "chart", "data-title": title});
  figure.append(el("figcaption", {}, title));
  const points = series.flatMap(s => s.points).filter(p => Number.isFinite(p[0]) && Number.isFinite(p[1]));
  if (!points.length) { figure.append(el("p", {class: "muted"}, "no values")); return figure; }
  const [xLow, xHigh] = extent(points.map(p => p[0])), [yLow, yHigh] = extent(points.map(p => p[1]));
  const xTicks = niceTicks(xLow, xHigh, 5), yTicks = niceTicks(yLow, yHigh, 4);
  const x0 = xTicks[0], x1 = xTicks[xTicks.length - 1], y0 = yTicks[0], y1 = yTicks[yTicks.length - 1];
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - Bt - (y - y0) / (y1 - y0) * (H - T - Bt);
  let svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img">`;
  for (const y of yTicks) {
    svg += `<line x1="${L}" x2="${W - R}" y1="${sy(y)}" y2="${sy(y)}" stroke="#eaeef2"/>`;
    svg += `<text x="${L - 4}" y="${sy(y) + 4}" font-size="10" text-anchor="end" fill="#656d76">${esc(tick(y))}</text>`;
  }
  for (const x of xTicks)
    svg += `<text x="${sx(x)}" y="${H - Bt + 14}" font-size="10" text-anchor="middle" fill="#656d76">${esc(tick(x))}</text>`;
  svg += `<text x="${(L + W - R) / 2}" y="${H - 4}" font-size="11" text-anchor="middle" fill="#656d76">${esc(xLabel)}</text>`;
  series.forEach((s, i) => {
    const good = s.points.filter(p => Number.isFinite(p[0]) && Number.isFinite(p[1]));
    const color = COLORS[i % COLORS.length];
    svg += `<polyline class="series" data-label="${esc(s.label)}" fill="none" stroke="${color}" stroke-width="1.8" points="${good.map(p => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" ")}"/>`;
    if (good.length < 60) for (const p of good) svg += `<circle cx="${sx(p[0]).toFixed(1)}" cy="${sy(p[1]).toFixed(1)}" r="2.5" fill="${color}"/>`;
  });
  figure.insertAdjacentHTML("beforeend", svg + "</svg>");
  if (series.length > 1 || series[0].label) figure.append(el("div", {class: "legend"},
    series.map((s, i) => el("span", {}, swatch(COLORS[i % COLORS.length]), s.label))));
  return figure;
}
// A legend's colour, set through the CSSOM: a style attribute would need 'unsafe-inline' in the page's policy.
function swatch(color) { const node = el("i", {class: "swatch"}); node.style.backgroundColor = color; return node; }
// The metrics worth a curve: losses and accuracies first, as `rayjobs compare` ranks them.
function curveMetrics(reportLists, limit) {
  const counts = {};
  for (const reports of reportLists) {
    const seen = new Set(reports.flatMap(r => Object.keys(r.metrics).filter(k => typeof r.metrics[k] === "number")));
    for (const name of seen) if (!["epoch", "step", "iteration"].includes(name)) counts[name] = (counts[name] || 0) + 1;
  }
  const rank = name => { const n = name.toLowerCase(); return n.includes("loss") ? 0 : (n.includes("acc") ? 1 : (/(_per_s|throughput)$/.test(n) ? 2 : 3)); };
  return Object.keys(counts).sort((a, b) => rank(a) - rank(b) || counts[b] - counts[a]).slice(0, limit);
}
function curvePoints(reports, metric) {
  return reports.filter(r => typeof r.metrics[metric] === "number")
    .map((r, i) => [r.metrics.epoch != null ? r.metrics.epoch : (r.iteration != null ? r.iteration : i + 1), r.metrics[metric]]);
}

// ---- the runs page
const RUN_COLUMNS = [["run", "Run"], ["status", "Status"], ["cause", "Cause of failure"], ["duration_s", "Duration"],
  ["key_metric", "Key metric"], ["queue", "Queue"], ["attempts", "Attempts"], ["where", "Where it ran"], ["started", "Started"]];
const runsState = {sort: "started", up: false, rows: []};
function sortValue(row, key) {
  if (key === "cause") return row.cause ? row.cause.cause : "";
  if (key === "key_metric") return row.key_metric ? row.key_metric.value : -Infinity;
  const value = row[key]; return value == null ? (typeof row.started === "number" ? -Infinity : "") : value;
}
function drawRuns() {
  const text = $("#filter").value.toLowerCase(), status = $("#status-filter").value;
  const rows = runsState.rows.filter(row => (!status || row.status === status) &&
    (!text || [row.run, row.name, row.status, row.cause && row.cause.cause, row.queue, row.host, row.metrics_text]
      .some(v => v && String(v).toLowerCase().includes(text))));
  rows.sort((a, b) => { const x = sortValue(a, runsState.sort), y = sortValue(b, runsState.sort);
    const order = x < y ? -1 : (x > y ? 1 : 0); return runsState.up ? order : -order; });
  const body = $("#runs tbody"); body.replaceChildren();
  for (const row of rows) {
    body.append(el("tr", {"data-run": row.run, "data-status": row.status},
      el("td", {}, el("input", {type: "checkbox", class: "pick", value: row.run})),
      el("td", {}, el("a", {href: runHref(row.run)}, row.run), row.name && row.name !== row.run ? el("div", {class: "muted"}, row.name) : null,
        row.pipeline ? el("div", {}, pipelineLink(row.pipeline)) : null),
      el("td", {}, badge(row.status)),
      el("td", {class: "cause-cell", title: row.cause ? row.cause.text || "" : (row.error || "")},
         row.cause ? row.cause.cause : (row.status === "UNREADABLE" ? row.error : "")),
      el("td", {class: "num"}, row.duration || "-"),
      el("td", {class: "metric"}, row.key_metric ? `${row.key_metric.name} ${row.key_metric.text}` : "-"),
      el("td", {}, row.queue || "-"),
      el("td", {class: "num"}, String(row.attempts)),
      el("td", {}, row.where),
      el("td", {}, row.started_text)));
  }
  $("#count").textContent = `${rows.length} of ${runsState.rows.length} runs`;
}
async function runsPage() {
  const head = $("#runs thead tr");
  head.append(el("th", {}, ""));
  for (const [key, label] of RUN_COLUMNS) {
    const th = el("th", {"data-key": key}, label);
    th.addEventListener("click", () => { runsState.up = runsState.sort === key ? !runsState.up : false; runsState.sort = key;
      head.querySelectorAll("th").forEach(h => h.classList.toggle("sorted", h === th));
      th.classList.toggle("up", runsState.up); drawRuns(); });
    head.append(th);
  }
  $("#filter").addEventListener("input", drawRuns);
  $("#status-filter").addEventListener("change", drawRuns);
  $("#compare").addEventListener("click", () => {
    const names = [...document.querySelectorAll("input.pick:checked")].map(box => box.value);
    if (names.length < 2) { $("#compare-note").textContent = "pick two or more runs"; return; }
    location.href = compareHref(names);
  });
  if (EXPORT) {
    $("#search").disabled = true;
    $("#search-results").textContent = "Searching the logs of every run needs the served page: run `rayjobs ui` over these records.";
  } else {
    $("#search-form").addEventListener("submit", async event => { event.preventDefault(); await searchAll($("#search").value); });
  }
  const load = async () => {
    const table = EXPORT ? embedded() : await api("/api/runs");
    runsState.rows = table.runs;
    $("#where").textContent = table.location;
    const statuses = [...new Set(table.runs.map(r => r.status))].sort(), picked = $("#status-filter").value;
    $("#status-filter").replaceChildren(el("option", {value: ""}, "any status"), ...statuses.map(s => el("option", {value: s}, s)));
    $("#status-filter").value = statuses.includes(picked) ? picked : "";
    drawRuns();
    $("#live").textContent = table.live && !EXPORT ? "a run is going: refreshing" : "";
    if (table.live && !EXPORT) setTimeout(() => load().catch(fail), REFRESH_MS);
  };
  await load();
}
async function searchAll(query) {
  const out = $("#search-results"); out.replaceChildren(el("p", {class: "muted"}, "searching…"));
  if (!query.trim()) { out.replaceChildren(); return; }
  const found = await api("/api/search?q=" + encodeURIComponent(query));
  out.replaceChildren(el("p", {class: "muted", id: "search-count"},
    `${found.matches.length} line(s) hold "${query}"` + (found.complete ? "" : " (the first ones)")
    + (found.skipped && found.skipped.length ? `; not searched, their logs cannot be read: ${[...new Set(found.skipped.map(s => s.run))].join(", ")}` : "")));
  const list = el("table", {id: "search-table"}, el("tr", {}, el("th", {}, "Run"), el("th", {}, "Line"), el("th", {}, "Text")));
  for (const match of found.matches) {
    const href = runHref(match.run) + `#log=${encodeURIComponent(match.submission_id)}:${match.page}:${encodeURIComponent(query)}`;
    list.append(el("tr", {class: "hit"}, el("td", {}, el("a", {href}, match.run)), el("td", {class: "num"}, String(match.line)),
      el("td", {class: "mono"}, match.text)));
  }
  out.append(list);
}

// ---- one run's page
function facts(pairs) { return el("dl", {class: "facts"}, pairs.filter(p => p[1] != null && p[1] !== "")
  .flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])); }
function causeBox(cause) {
  return el("div", {class: "cause", "data-cause": cause.cause}, el("strong", {}, cause.cause), ": ", cause.text || "",
    cause.advice ? el("div", {class: "advice"}, "Fix: ", cause.advice) : null,
    cause.evidence ? el("div", {class: "mono muted"}, cause.evidence) : null,
    cause.retryable != null ? el("div", {class: "muted"}, cause.retryable ? "another attempt may get past it" : "another attempt would not get past it") : null);
}
function drawRun(run) {
  document.title = run.run + " · rayjobs ui";
  $("#title").replaceChildren(run.run, " ", badge(run.status));
  $("#live").textContent = run.live && !EXPORT ? "running: refreshing every few seconds" : "";
  $("#summary").replaceChildren(facts([["name", run.name], ["location", el("span", {class: "mono"}, run.location)],
    ["started", run.started_text], ["ended", run.ended_text], ["duration", run.duration], ["attempts", String(run.attempts.length)],
    ["metrics", run.metrics_text || "-"], ["queue", run.queue], ["where it ran", run.where],
    ["record schema", run.schema_version], ["rerun of", run.rerun_of], ["pipeline", run.pipeline ? pipelineLink(run.pipeline) : null]]), run.cause ? causeBox(run.cause) : "",
    ...(run.notes || []).map(note => el("p", {class: "muted note"}, typeof note === "string" ? note : JSON.stringify(note))));
  const metrics = curveMetrics([run.reports], 6);
  $("#curves").replaceChildren(...(metrics.length ? metrics.map(m => chart(m, [{label: "", points: curvePoints(run.reports, m)}], "epoch (or report)"))
    : [el("p", {class: "muted"}, "no metrics reported over time")]));
  const attempts = el("table", {id: "attempts-table"}, el("tr", {}, ...["#", "Ray job", "Status", "Exit", "Started", "Duration", "Host", "Cause and its fix"].map(h => el("th", {}, h))));
  for (const a of run.attempts) attempts.append(el("tr", {"data-attempt": a.attempt}, el("td", {}, String(a.attempt)),
    el("td", {class: "mono"}, a.submission_id), el("td", {}, badge(a.status)), el("td", {class: "num"}, a.exit_code == null ? "-" : String(a.exit_code)),
    el("td", {}, a.started_text), el("td", {class: "num"}, a.duration), el("td", {}, a.host || "-"), el("td", {}, a.cause ? causeBox(a.cause) : "-")));
  const decisions = run.decisions.map(d => el("li", {}, `${d.event}: `, d.text || d.cause || d.state || "", d.delay_s != null ? ` (again after ${d.delay_s}s)` : ""));
  $("#attempts").replaceChildren(attempts, decisions.length ? el("ul", {id: "decisions"}, decisions) : "");
  drawResources(run);
  drawTrials(run);
  $("#spec").replaceChildren(el("pre", {id: "spec-text"}, JSON.stringify(run.spec, null, 2)), el("div", {class: "muted"}, "spec hash " + (run.spec_hash || "-")));
  const p = run.provenance, code = p.code || {}, git = code.git || {};
  $("#provenance").replaceChildren(facts([["working_dir", code.working_dir], ["git commit", git.commit ? git.commit + (git.dirty ? ` (uncommitted changes, hash ${git.changes_hash})` : "") : null],
    ["package", code.working_dir_package], ["versions", Object.entries(p.versions || {}).filter(e => e[1]).map(e => e.join(" ")).join(", ")],
    ["cluster", run.cluster_text]]),
    drawPrevious(run.previous));
}
function drawPrevious(previous) {
  if (!previous) return el("p", {class: "muted", id: "previous"}, "no earlier run of the same name here");
  const rows = previous.differences.map(d => el("tr", {}, el("td", {class: "mono"}, d.field),
    el("td", {class: "mono"}, JSON.stringify(d.before)), el("td", {class: "mono"}, JSON.stringify(d.after))));
  return el("div", {id: "previous"}, el("h3", {}, "Since the previous run of this name: ", el("a", {href: runHref(previous.run)}, previous.run), " ", badge(previous.status)),
    rows.length ? el("table", {}, el("tr", {}, el("th", {}, "field"), el("th", {}, "then"), el("th", {}, "now")), rows) : el("p", {}, "no difference in spec, code, versions or cluster"));
}
function drawResources(run) {
  const box = $("#resources"), samples = run.resources;
  if (!samples.length) { box.replaceChildren(el("p", {class: "muted"}, "no resource samples in this record")); return; }
  const t0 = samples[0].time, xs = s => (s.time - t0);
  const plots = [chart("CPU cores in use", [{label: "", points: samples.map(s => [xs(s), s.cpu])}], "seconds"),
    chart("memory (RSS, GiB)", [{label: "", points: samples.map(s => [xs(s), (s.rss_bytes || 0) / 2 ** 30])}], "seconds")];
  if (samples.some(s => s.gpu_util != null)) {
    plots.push(chart("GPU utilisation (%)", [{label: "", points: samples.filter(s => s.gpu_util != null).map(s => [xs(s), s.gpu_util])}], "seconds"));
    plots.push(chart("GPU memory (GiB)", [{label: "", points: samples.filter(s => s.gpu_mem_bytes != null).map(s => [xs(s), s.gpu_mem_bytes / 2 ** 30])}], "seconds"));
  }
  box.replaceChildren(el("div", {class: "charts"}, plots), run.resource_facts ? facts(run.resource_facts) : "");
}
function drawTrials(run) {
  const section = $("#trials-section");
  if (!run.trials.length) { section.hidden = true; return; }
  section.hidden = false;
  const keys = [...new Set(run.trials.flatMap(t => Object.keys(t.values)))];
  const table = el("table", {id: "trials-table"}, el("tr", {}, el("th", {}, "trial"), el("th", {}, "state"), ...keys.map(k => el("th", {}, k)), el("th", {}, "epoch"), el("th", {}, "metric")));
  for (const t of run.trials) table.append(el("tr", {"data-trial": t.trial}, el("td", {class: "mono"}, t.trial), el("td", {}, t.state || "-"),
    ...keys.map(k => el("td", {}, t.value_texts[k] == null ? "-" : t.value_texts[k])), el("td", {class: "num"}, t.epoch == null ? "-" : String(t.epoch)),
    el("td", {class: "num"}, t.metric_text)));
  $("#trials").replaceChildren(table, el("div", {class: "charts"}, chart("trials: metric by epoch", run.trials.map(t => ({label: t.trial, points: t.points})), "epoch")));
}
const logState = {submission: null, page: 0, pages: 1, query: ""};
function highlighted(text, query) {
  if (!query) return esc(text);
  const lower = text.toLowerCase(), q = query.toLowerCase(); let out = "", at = 0, i;
  while ((i = lower.indexOf(q, at)) >= 0) { out += esc(text.slice(at, i)) + "<mark>" + esc(text.slice(i, i + q.length)) + "</mark>"; at = i + q.length; }
  return out + esc(text.slice(at));
}
async function showLogPage(name, page) {
  const answer = await api(`/api/run/${encodeURIComponent(name)}/log?attempt=${encodeURIComponent(logState.submission)}&page=${page}`);
  logState.page = answer.page; logState.pages = answer.pages;
  $("#log-text").innerHTML = highlighted(answer.text, logState.query);
  $("#log-where").textContent = `page ${answer.page + 1} of ${answer.pages} (bytes ${answer.start}-${answer.end} of ${answer.bytes})`;
  $("#log-prev").disabled = answer.page <= 0; $("#log-next").disabled = answer.page >= answer.pages - 1;
  const mark = $("#log-text mark"); if (mark) mark.scrollIntoView({block: "center"});
}
async function searchLog(name, query) {
  logState.query = query; const out = $("#log-matches");
  if (!query) { out.replaceChildren(); return; }
  const found = await api(`/api/run/${encodeURIComponent(name)}/log?attempt=${encodeURIComponent(logState.submission)}&q=${encodeURIComponent(query)}`);
  out.replaceChildren(el("p", {class: "muted", id: "log-match-count"}, `${found.matches.length} line(s) hold "${query}"`),
    ...found.matches.map(m => { const line = el("div", {class: "match mono", "data-page": m.page}, `line ${m.line} (page ${m.page + 1}): ${m.text}`);
      line.addEventListener("click", () => showLogPage(name, m.page).catch(fail)); return line; }));
}
function setUpLog(run) {
  const box = $("#log");
  if (!run.logs.length) { box.replaceChildren(el("p", {class: "muted"}, "no log saved")); return; }
  if (EXPORT) {
    box.replaceChildren(...run.logs.map(log => el("div", {class: "log-files"}, el("strong", {}, `${log.submission_id} (attempt ${log.attempts.join(", ")}, ${log.bytes_text}): `),
      ...Array.from({length: log.pages}, (_, i) => [el("a", {href: `${encodeURIComponent(run.run)}/log-${encodeURIComponent(log.submission_id)}-${i + 1}.txt`}, `page ${i + 1}`), " "]))),
      el("p", {class: "muted"}, "The log is in plain-text pages beside this file, masked; searching it needs the served page (`rayjobs ui`)."));
    return;
  }
  const pick = el("select", {id: "log-attempt"}, run.logs.map(log => el("option", {value: log.submission_id}, `${log.submission_id} (attempt ${log.attempts.join(", ")}, ${log.bytes_text})`)));
  const search = el("input", {id: "log-search", type: "search", placeholder: "search this log"});
  box.replaceChildren(el("div", {class: "controls"}, pick, el("button", {id: "log-prev"}, "◀ earlier"), el("span", {id: "log-where"}), el("button", {id: "log-next"}, "later ▶"),
    el("form", {id: "log-search-form"}, search, el("button", {}, "search"))), el("div", {id: "log-matches"}), el("pre", {id: "log-text"}, "loading…"));
  logState.submission = run.logs[run.logs.length - 1].submission_id; pick.value = logState.submission;
  const name = run.run;
  pick.addEventListener("change", () => { logState.submission = pick.value; showLogPage(name, 0).catch(fail); searchLog(name, logState.query).catch(fail); });
  $("#log-prev").addEventListener("click", () => showLogPage(name, logState.page - 1).catch(fail));
  $("#log-next").addEventListener("click", () => showLogPage(name, logState.page + 1).catch(fail));
  $("#log-search-form").addEventListener("submit", event => { event.preventDefault(); searchLog(name, search.value).catch(fail); });
  const wanted = /#log=([^:]*):(\d+):?(.*)$/.exec(location.hash);
  if (wanted) { logState.submission = decodeURIComponent(wanted[1]); pick.value = logState.submission; logState.query = decodeURIComponent(wanted[3] || ""); search.value = logState.query;
    return Promise.all([showLogPage(name, Number(wanted[2])), searchLog(name, logState.query)]); }
  return showLogPage(name, 0);
}
async function runPage() {
  const name = B.run, path = "/api/run/" + encodeURIComponent(name);
  const run = EXPORT ? embedded() : await api(path);
  drawRun(run);
  await setUpLog(run);
  if (run.live && !EXPORT) {
    const again = async () => { const next = await api(path); drawRun(next);
      // A log still growing: the last page is shown again, as long as the reader stayed on it.
      if (logState.page >= logState.pages - 1 && !logState.query) await showLogPage(name, 1e9);
      if (next.live) setTimeout(() => again().catch(fail), REFRESH_MS); };
    setTimeout(() => again().catch(fail), REFRESH_MS);
  }
}

// ---- runs side by side
async function comparePage() {
  const names = new URLSearchParams(location.search).getAll("run");
  const load = async () => {
    let runs;
    if (EXPORT) { const all = embedded().runs; runs = names.map(n => all.find(r => r.run === n)).filter(Boolean); }
    else runs = (await api("/api/compare?" + names.map(n => "run=" + encodeURIComponent(n)).join("&"))).runs;
    const metricNames = [...new Set(runs.flatMap(r => Object.keys(r.metrics || {})))];
    const table = el("table", {id: "compare-table"}, el("tr", {}, el("th", {}, ""), ...runs.map(r => el("th", {}, el("a", {href: runHref(r.run)}, r.run)))),
      el("tr", {}, el("td", {}, "status"), ...runs.map(r => el("td", {}, badge(r.status)))),
      el("tr", {}, el("td", {}, "duration"), ...runs.map(r => el("td", {}, r.duration))),
      el("tr", {}, el("td", {}, "cause"), ...runs.map(r => el("td", {}, r.cause ? r.cause.cause : "-"))),
      ...metricNames.map(m => el("tr", {"data-metric": m}, el("td", {}, m), ...runs.map(r => el("td", {class: "num"}, (r.metric_texts || {})[m] == null ? "-" : r.metric_texts[m])))));
    const metrics = curveMetrics(runs.map(r => r.reports), 6);
    $("#compare").replaceChildren(table);
    $("#curves").replaceChildren(...(metrics.length ? metrics.map(m => chart(m, runs.map(r => ({label: r.run, points: curvePoints(r.reports, m)})), "epoch (or report)"))
      : [el("p", {class: "muted"}, "no run reported metrics over time")]));
    if (runs.some(r => !["SUCCEEDED", "FAILED", "STOPPED", "LOST", "UNREADABLE"].includes(r.status)) && !EXPORT) setTimeout(() => load().catch(fail), REFRESH_MS);
  };
  await load();
}

// ---- a pipeline run: its jobs as a graph, a column per layer, each node its job's status and a link to its run
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) if (value != null) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}
// A name longer than a node is cut there; the node's tooltip holds it whole.
function clipped(text, most) { return text.length > most ? text.slice(0, most - 1) + "…" : text; }
function graph(pipeline) {
  const NW = 180, NH = 46, GX = 70, GY = 18, PAD = 10;
  const place = {};
  pipeline.layers.forEach((layer, column) => layer.forEach((name, row) => { place[name] = {x: PAD + column * (NW + GX), y: PAD + row * (NH + GY)}; }));
  const rows = Math.max(...pipeline.layers.map(layer => layer.length));
  const W = PAD * 2 + pipeline.layers.length * NW + (pipeline.layers.length - 1) * GX, H = PAD * 2 + rows * NH + (rows - 1) * GY;
  const drawing = svg("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", id: "pipeline-graph"});
  drawing.append(svg("defs", {}, svg("marker", {id: "arrow", viewBox: "0 0 8 8", refX: 8, refY: 4, markerWidth: 8, markerHeight: 8, orient: "auto"},
    svg("path", {d: "M0,0 L8,4 L0,8 z", class: "arrowhead"}))));
  for (const job of pipeline.jobs) for (const before of job.after) {
    const from = place[before], to = place[job.job];
    if (!from || !to) continue;
    const x1 = from.x + NW, y1 = from.y + NH / 2, x2 = to.x, y2 = to.y + NH / 2, bend = (x2 - x1) / 2;
    drawing.append(svg("path", {class: "edge", "data-from": before, "data-to": job.job, "marker-end": "url(#arrow)",
      d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`}));
  }
  for (const job of pipeline.jobs) {
    const at = place[job.job];
    const node = svg("g", {class: "node s-" + job.status, "data-job": job.job, "data-status": job.status, transform: `translate(${at.x},${at.y})`},
      svg("title", {}, `${job.job}: ${job.status}` + (job.location ? ` (${job.location})` : "")),
      svg("rect", {width: NW, height: NH, rx: 6}),
      svg("text", {x: 10, y: 19, class: "job"}, clipped(job.job, 22)),
      svg("text", {x: 10, y: 36, class: "state"}, job.status));
    drawing.append(job.run ? svg("a", {href: runHref(job.run), "data-run": job.run}, node) : node);
  }
  return drawing;
}
function drawPipeline(pipeline) {
  document.title = `pipeline ${pipeline.pipeline} · rayjobs ui`;
  $("#title").replaceChildren(`pipeline ${pipeline.pipeline}`);
  $("#where").textContent = pipeline.location;
  $("#live").textContent = pipeline.live && !EXPORT ? "a job is going: refreshing" : "";
  $("#summary").replaceChildren(facts([["jobs", String(pipeline.jobs.length)], ["layers", String(pipeline.layers.length)]]),
    pipeline.problem ? el("p", {class: "cause"}, pipeline.problem) : "");
  $("#graph").replaceChildren(graph(pipeline));
  const table = el("table", {id: "jobs-table"}, el("tr", {}, ...["Layer", "Job", "After", "Status", "Run"].map(h => el("th", {}, h))));
  for (const job of pipeline.jobs) table.append(el("tr", {"data-job": job.job}, el("td", {class: "num"}, String(job.layer)), el("td", {}, job.job),
    el("td", {}, job.after.join(", ") || "-"), el("td", {}, badge(job.status)),
    el("td", {class: "mono"}, job.run ? el("a", {href: runHref(job.run)}, job.run) : (job.location || "-"))));
  $("#jobs").replaceChildren(table);
}
async function pipelinePage() {
  const path = "/api/pipeline/" + encodeURIComponent(B.run);
  const load = async () => {
    const pipeline = EXPORT ? embedded() : await api(path);
    drawPipeline(pipeline);
    if (pipeline.live && !EXPORT) setTimeout(() => load().catch(fail), REFRESH_MS);
  };
  await load();
}

const PAGES = {runs: runsPage, run: runPage, compare: comparePage, pipeline: pipelinePage};
PAGES[B.page]().then(() => { document.body.dataset.ready = "1"; }).catch(fail);
