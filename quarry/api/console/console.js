// Quarry's web console: a client of the REST API (docs/console.md). No framework, no build step.
// Every text from the server goes into the page as a text node (textContent), never as HTML.
// The key lives in sessionStorage and travels as the Authorization header only.
"use strict";

const KEY = "quarry.key";
const $ = (id) => document.getElementById(id);
const VIEWS = ["collections", "search", "answer", "jobs", "recall", "reports"];
const UNFINISHED = new Set(["queued", "running", "cancelling"]);
let timer = null; // the shown view's poller
let answerAbort = null;
const recallHistory = new Map(); // collection -> [{t, buckets}]

// ---------- DOM and formatting ----------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  return String(value);
}

function status(message, isError = false) {
  const line = $("status");
  line.textContent = message || "";
  line.className = isError ? "error" : "";
}

// ---------- the API ----------
class ApiError extends Error {
  constructor(httpStatus, type, message) {
    super(message);
    this.status = httpStatus;
    this.type = type;
  }
}

function authHeaders(extra) {
  const headers = Object.assign({}, extra || {});
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = "Bearer " + key;
  return headers;
}

async function call(method, path, options = {}) {
  const init = { method, headers: authHeaders(options.headers), cache: "no-store", signal: options.signal };
  if (options.json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.json);
  } else if (options.body !== undefined) {
    init.body = options.body;
  }
  // relative to the page (/console): the API's root, also behind a proxy that serves it under a prefix
  const response = await fetch(path.replace(/^\//, ""), init);
  if (!response.ok) {
    let type = "HTTP " + response.status, message = response.statusText;
    try {
      const body = await response.json();
      if (body && body.error) ({ type, message } = body.error);
      else if (body && body.detail) message = JSON.stringify(body.detail);
    } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, type, message);
  }
  return response;
}

const getJSON = async (path) => (await call("GET", path)).json();
const q = encodeURIComponent;

function failed(error) {
  if (error.name === "AbortError") return;
  const hint = error.status === 401 ? " (enter an API key above)" : "";
  status(error instanceof ApiError ? `${error.type}: ${error.message}${hint}` : String(error), true);
}

// ---------- key ----------
function showKeyState(text, isError = false) {
  $("key-state").textContent = text;
  $("key-state").className = isError ? "error" : "ok";
}

async function checkKey() {
  try {
    const found = await getJSON("/v1/collections");
    const kind = sessionStorage.getItem(KEY) ? "key accepted" : "no key sent (open server)";
    showKeyState(`${kind}: ${found.collections.length} collection(s)`);
    fillCollections(found.collections);
    return true;
  } catch (error) {
    showKeyState(error instanceof ApiError ? `${error.type}: ${error.message}` : String(error), true);
    return false;
  }
}

function fillCollections(collections) {
  for (const select of document.querySelectorAll(".collection-select")) {
    const chosen = select.value;
    select.replaceChildren(...collections.map((c) => el("option", { value: c.name }, c.name)));
    if (collections.some((c) => c.name === chosen)) select.value = chosen;
  }
}

// ---------- collections ----------
async function showCollections() {
  const found = await getJSON("/v1/collections");
  fillCollections(found.collections);
  const rows = await Promise.all(found.collections.map(async (c) => {
    let d = c;
    try { d = await getJSON(`/v1/collections/${q(c.name)}`); } catch (_) { /* listed but not described */ }
    const versions = (d.versions || []).map((v) =>
      el("li", {}, `v${v.version} ${v.state}`, v.model ? ` · ${v.model}` : "", v.index ? ` · ${v.index}` : "",
        v.chunks !== undefined ? ` · ${v.chunks} chunks` : ""));
    return el("tr", { dataset: { collection: c.name } },
      el("td", {}, c.name, c.tenancy === "shared" ? el("span", { class: "tag" }, "shared") : null),
      el("td", { class: "num" }, fmt(d.documents)), el("td", { class: "num" }, fmt(d.chunks)),
      el("td", { class: "num" }, fmt(d.live_version)), el("td", {}, el("ul", { class: "plain" }, versions)),
      el("td", {}, `${fmt(d.language)} · chunks ${fmt(d.chunk_size)}/${fmt(d.chunk_overlap)}`,
        d.fusion && d.fusion.method ? ` · ${d.fusion.method}` : ""));
  }));
  $("collections-table").tBodies[0].replaceChildren(...rows);
}

async function createCollection(event) {
  event.preventDefault();
  try {
    await call("POST", "/v1/collections", { json: { name: $("create-name").value, language: $("create-language").value } });
    status(`created ${$("create-name").value}`);
    await showCollections();
  } catch (error) { failed(error); }
}

// ---------- search ----------
function numberOf(id) {
  const text = $(id).value.trim();
  return text === "" ? null : Number(text);
}

function fusionOf() {
  const fusion = {};
  if ($("fusion-method").value) fusion.method = $("fusion-method").value;
  if (numberOf("fusion-k") !== null) fusion.k = numberOf("fusion-k");
  const weights = {};
  if (numberOf("fusion-bm25") !== null) weights.bm25 = numberOf("fusion-bm25");
  if (numberOf("fusion-dense") !== null) weights.dense = numberOf("fusion-dense");
  if (Object.keys(weights).length) fusion.weights = weights;
  if ($("fusion-norm").value) fusion.normalization = $("fusion-norm").value;
  return Object.keys(fusion).length ? fusion : null;
}

function explainTable(explain) {
  const rows = [];
  for (const channel of ["bm25", "dense"]) {
    const c = explain[channel];
    rows.push(el("tr", { class: c ? "" : "missed" }, el("th", {}, channel),
      el("td", { class: "num" }, c ? fmt(c.rank) : "not found"), el("td", { class: "num" }, c ? fmt(c.score, 4) : ""),
      el("td", { class: "num" }, c ? fmt(c.normalized, 4) : ""), el("td", { class: "id" }, c ? c.chunk_id : "")));
  }
  const table = el("table", { class: "explain" },
    el("thead", {}, el("tr", {}, el("th", {}, "channel"), el("th", {}, "rank"), el("th", {}, "score"),
      el("th", {}, "normalized"), el("th", {}, "chunk"))),
    el("tbody", {}, rows));
  const notes = [];
  const f = explain.fusion;
  if (f) {
    const how = f.method === "rrf" ? `k ${f.k}` : `normalization ${f.normalization}`;
    const weights = Object.entries(f.weights || {}).map(([k, v]) => `${k} ${v}`).join(", ");
    notes.push(el("p", { class: "fusion" }, `fusion ${f.method} (${how}; weights ${weights}) → ${fmt(f.score, 5)}`));
  }
  if (explain.rerank) {
    notes.push(el("p", { class: "fusion" }, `rerank ${fmt(explain.rerank.score, 4)}, rank before ${explain.rerank.rank_before}`));
  }
  return el("div", { class: "explain-box" }, table, notes);
}

async function runSearch(event) {
  event.preventDefault();
  status("");
  const body = { query: $("search-query").value, mode: $("search-mode").value, top_k: numberOf("search-top-k") || 10 };
  const filters = $("search-filters").value.trim();
  if (filters) {
    try { body.filters = JSON.parse(filters); } catch (error) { status(`filters: not JSON (${error.message})`, true); return; }
  }
  const fusion = fusionOf();
  if (fusion) body.fusion = fusion;
  try {
    const result = await (await call("POST", `/v1/collections/${q($("search-collection").value)}/search`, { json: body })).json();
    const degraded = result.degraded && result.degraded.length ? ` · degraded: ${result.degraded.join("; ")}` : "";
    $("search-summary").textContent = `${result.hits.length} hit(s) of ${result.total} · ${result.mode} · ${fmt(result.took_ms, 1)} ms${degraded}`;
    $("search-results").replaceChildren(...result.hits.map((hit) => el("li", { class: "hit" },
      el("div", { class: "hit-head" }, el("span", { class: "id" }, hit.document_id), el("span", { class: "score" }, fmt(hit.score, 5))),
      el("p", { class: "text" }, hit.text),
      Object.keys(hit.metadata || {}).length ? el("p", { class: "meta" }, JSON.stringify(hit.metadata)) : null,
      explainTable(hit.explain || {}))));
  } catch (error) { failed(error); }
}

// ---------- answers (Server-Sent Events over fetch: EventSource cannot send a header) ----------
async function* serverSentEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "", buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += value;
    const cut = pending.endsWith("\r") ? pending.length - 1 : pending.length; // a CRLF may span two reads
    buffer += pending.slice(0, cut).replace(/\r\n?/g, "\n");
    pending = pending.slice(cut);
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue; // a comment (the server's ping)
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") type = text;
        else if (field === "data") data.push(text);
      }
      if (data.length) yield { type, data: JSON.parse(data.join("\n")) };
    }
  }
}

function highlight(number, quote) {
  for (const item of $("sources").children) item.classList.remove("cited");
  const item = document.getElementById(`source-${number}`);
  if (!item) return;
  const text = item.querySelector(".text");
  const full = text.dataset.full;
  const at = quote ? full.indexOf(quote) : -1;
  if (at >= 0) {
    text.replaceChildren(full.slice(0, at), el("mark", {}, quote), full.slice(at + quote.length));
  } else {
    text.replaceChildren(el("mark", {}, full));
  }
  item.classList.add("cited");
  item.scrollIntoView({ block: "nearest" });
}

function citeLink(citation) {
  return el("a", {
    href: "#answer", class: "cite", dataset: { source: String(citation.marker) },
    title: citation.quote || "", onclick: (event) => { event.preventDefault(); highlight(citation.marker, citation.quote); },
  }, citation.text || `[${citation.marker}]`);
}

function renderAnswer(text, citations) {
  const parts = [];
  let at = 0;
  for (const c of [...citations].sort((a, b) => a.span[0] - b.span[0])) {
    const [start, end] = c.span; // a marker "[1, 2]" cites twice over one span: linked to its first source
    if (start < at || end > text.length) continue;
    parts.push(text.slice(at, start), citeLink(c));
    at = end;
  }
  parts.push(text.slice(at));
  $("answer-text").replaceChildren(...parts);
}

function addCitation(c) {
  $("citations").append(el("li", {}, citeLink(c), ` ${c.document_id}${c.title ? " — " + c.title : ""} `,
    el("span", { class: c.supported ? "ok" : "muted" }, c.supported ? "supported" : "weak support"),
    c.quote ? el("q", {}, c.quote) : null));
}

async function ask(event) {
  event.preventDefault();
  status("");
  if (answerAbort) answerAbort.abort();
  answerAbort = new AbortController();
  for (const id of ["answer-text", "citations", "sources"]) $(id).replaceChildren();
  $("answer-state").textContent = "retrieving…";
  const body = { query: $("answer-query").value, mode: $("answer-mode").value, top_k: numberOf("answer-top-k") || 3, stream: true };
  if (numberOf("answer-max-tokens") !== null) body.max_tokens = numberOf("answer-max-tokens");
  let text = "";
  const citations = [];
  try {
    const response = await call("POST", `/v1/collections/${q($("answer-collection").value)}/answer`,
      { json: body, signal: answerAbort.signal, headers: { Accept: "text/event-stream" } });
    for await (const event of serverSentEvents(response)) {
      if (event.type === "sources") {
        $("answer-state").textContent = `${event.data.sources.length} source(s); generating…`;
        $("sources").replaceChildren(...event.data.sources.map((s) => el("li", { id: `source-${s.number}`, value: s.number },
          el("div", { class: "hit-head" }, el("span", { class: "id" }, s.document_id), s.title ? ` ${s.title}` : "",
            el("span", { class: "score" }, fmt(s.score, 4))),
          el("p", { class: "text", dataset: { full: s.text } }, s.text))));
      } else if (event.type === "delta") {
        text += event.data.text;
        $("answer-text").textContent = text;
      } else if (event.type === "citation") {
        citations.push(event.data);
        addCitation(event.data);
      } else if (event.type === "done") {
        const final = event.data.answer === null || event.data.answer === undefined ? text : event.data.answer;
        renderAnswer(final, event.data.citations || citations);
        if (event.data.citations) {
          $("citations").replaceChildren();
          event.data.citations.forEach(addCitation);
        }
        const degraded = (event.data.degraded || []).join("; ");
        $("answer-state").textContent = `done (${event.data.finish_reason || "stop"})${degraded ? " · degraded: " + degraded : ""}`;
      } else if (event.type === "error") {
        $("answer-state").textContent = `error: ${event.data.error ? event.data.error.type + ": " + event.data.error.message : JSON.stringify(event.data)}`;
      }
    }
  } catch (error) {
    $("answer-state").textContent = error.name === "AbortError" ? "stopped" : "failed";
    failed(error);
  }
}

// ---------- jobs ----------
function jobRow(job) {
  const c = job.counters || {};
  const total = c.total || 0, done = c.done || 0;
  const bar = el("progress", { max: total || 1, value: total ? Math.min(done, total) : 0 });
  const cancel = UNFINISHED.has(job.state) && job.state !== "cancelling" && job.kind === "ingest"
    ? el("button", { type: "button", class: "cancel", onclick: () => cancelJob(job.id) }, "Cancel") : null;
  return el("tr", { dataset: { job: job.id, state: job.state } },
    el("td", { class: "id", title: job.id }, job.id.slice(0, 12)), el("td", {}, job.kind), el("td", {}, job.collection || ""),
    el("td", { class: "state" }, job.state, job.error ? el("div", { class: "error" }, job.error) : null),
    el("td", {}, bar, el("span", { class: "progress-text" }, ` ${done} / ${total}`)),
    el("td", { class: "num" }, job.rate_docs_s === null ? "–" : `${fmt(job.rate_docs_s, 1)}/s`),
    el("td", { class: "num" }, job.eta_s === null ? "–" : `${fmt(job.eta_s, 0)} s`), el("td", {}, cancel));
}

async function showJobs() {
  const found = await getJSON("/v1/jobs?limit=50");
  $("jobs-table").tBodies[0].replaceChildren(...found.jobs.map(jobRow));
  return found.jobs.some((j) => UNFINISHED.has(j.state));
}

async function cancelJob(id) {
  try {
    await call("DELETE", `/v1/jobs/${q(id)}`);
    await showJobs();
  } catch (error) { failed(error); }
}

async function submitJob(event) {
  event.preventDefault();
  status("");
  const name = q($("job-collection").value), file = $("job-file").files[0], path = $("job-path").value.trim();
  try {
    let job;
    if (file) {
      job = await (await call("POST", `/v1/collections/${name}/jobs?on_error=${q($("job-on-error").value)}`,
        { body: file, headers: { "Content-Type": "application/x-ndjson" } })).json();
    } else if (path) {
      job = await (await call("POST", `/v1/collections/${name}/jobs`, { json: { path, on_error: $("job-on-error").value } })).json();
    } else {
      status("choose an NDJSON file or name a path on the server", true);
      return;
    }
    status(`job ${job.id} ${job.state}`);
    $("job-form").reset();
    pollJobs();
  } catch (error) { failed(error); }
}

function pollJobs() {
  clearTimeout(timer);
  showJobs().then((busy) => {
    if (shown() === "jobs") timer = setTimeout(pollJobs, busy ? 500 : 5000);
  }, failed);
}

// ---------- recall ----------
function sparkline(points) {
  const ns = "http://www.w3.org/2000/svg", width = 160, height = 28;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("class", "spark");
  const values = points.filter((p) => p !== null);
  if (values.length) {
    const step = points.length > 1 ? width / (points.length - 1) : 0;
    const coords = points.map((v, i) => (v === null ? null : `${(i * step).toFixed(1)},${(height - 2 - v * (height - 4)).toFixed(1)}`)).filter(Boolean);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", coords.join(" "));
    svg.append(line);
  }
  return svg;
}

async function showRecall() {
  const name = $("recall-collection").value;
  if (!name) return;
  const r = await getJSON(`/v1/collections/${q(name)}/recall`);
  const history = recallHistory.get(name) || [];
  history.push({ t: Date.now(), buckets: r.buckets });
  recallHistory.set(name, history.slice(-60));
  $("recall-summary").textContent = `version ${fmt(r.version)} · window ${fmt(r.window_s, 0)} s · sample rate ${fmt(r.sample_rate, 3)} · `
    + `measured ${r.measured} of ${r.offered} offered · dropped ${r.dropped} · errors ${r.errors} · queued ${r.queued}`;
  $("recall-table").tBodies[0].replaceChildren(...Object.entries(r.buckets).map(([bucket, b]) => el("tr", {},
    el("th", {}, bucket), el("td", { class: "num" }, fmt(b.samples)), el("td", { class: "num" }, fmt(b.mean_recall)),
    el("td", { class: "num" }, fmt(b.p10_recall)),
    el("td", {}, sparkline(recallHistory.get(name).map((h) => (h.buckets[bucket] ? h.buckets[bucket].mean_recall : null)))))));
  const t = r.trigger;
  $("recall-trigger").textContent = `reindex trigger: ${t.fired ? "FIRED" : "not fired"} (floor ${t.floor}, window ${t.window_s} s) ${t.reason || ""}`;
}

function pollRecall() {
  clearTimeout(timer);
  showRecall().then(() => { if (shown() === "recall") timer = setTimeout(pollRecall, 5000); }, failed);
}

// ---------- reports ----------
async function showReports() {
  const found = await getJSON("/v1/reports");
  $("reports-note").textContent = found.configured ? `${found.reports.length} run(s)` : "no reports folder: set QUARRY_EVAL__REPORTS_DIR on the server";
  $("reports-table").tBodies[0].replaceChildren(...found.reports.map((r) => el("tr", { dataset: { report: r.id } },
    el("td", { class: "id" }, r.id), el("td", {}, fmt(r.dataset)), el("td", {}, fmt(r.started_at)),
    el("td", {}, Object.entries(r["ndcg@10"] || {}).map(([m, v]) => `${m} ${fmt(v, 4)}`).join(" · ")),
    el("td", {}, el("button", { type: "button", class: "open", onclick: () => openReport(r.id) }, "Open")))));
}

async function blobUrl(path) {
  return URL.createObjectURL(await (await call("GET", path)).blob());
}

async function openReport(id) {
  try {
    const r = await getJSON(`/v1/reports/${q(id)}`);
    $("report").hidden = false;
    $("report-title").textContent = `${r.id} · ${fmt(r.dataset)} · ${fmt(r.collection)}`;
    const modes = (r.summary && r.summary.modes) || {};
    $("report-means").tBodies[0].replaceChildren(...Object.entries(modes).map(([mode, m]) => el("tr", {},
      el("th", {}, mode), ...["ndcg@10", "recall@10", "recall@100", "mrr@10"].map((k) => el("td", { class: "num" }, fmt(m[k], 4))),
      el("td", { class: "num" }, fmt(m.latency_ms && m.latency_ms.p50, 2)), el("td", { class: "num" }, fmt(m.latency_ms && m.latency_ms.p95, 2)),
      el("td", { class: "num" }, fmt(m.num_queries)))));
    for (const old of $("report-plots").querySelectorAll("img")) URL.revokeObjectURL(old.src);
    const plots = await Promise.all(r.files.filter((f) => f.endsWith(".png")).map(async (f) =>
      el("img", { src: await blobUrl(`/v1/reports/${q(id)}/${q(f)}`), alt: f })));
    $("report-plots").replaceChildren(...plots);
    $("report-md").textContent = r.report_md || "";
    $("report-download").hidden = !r.files.includes("report.html");
    $("report-download").dataset.report = id;
    $("report").scrollIntoView({ block: "start" });
  } catch (error) { failed(error); }
}

async function downloadReport() {
  try {
    const url = await blobUrl(`/v1/reports/${q($("report-download").dataset.report)}/report.html`);
    const link = el("a", { href: url, download: `${$("report-download").dataset.report}-report.html` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (error) { failed(error); }
}

// ---------- views ----------
const SHOW = {
  collections: () => showCollections().catch(failed),
  search: () => checkKey(),
  answer: () => checkKey(),
  jobs: () => { checkKey(); pollJobs(); },
  recall: () => checkKey().then(pollRecall),
  reports: () => showReports().catch(failed),
};

function shown() {
  return document.body.dataset.view;
}

function route() {
  clearTimeout(timer);
  const name = VIEWS.includes(location.hash.slice(1)) ? location.hash.slice(1) : "collections";
  for (const view of VIEWS) $(`view-${view}`).hidden = view !== name;
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.view === name);
  document.body.dataset.view = name;
  status("");
  SHOW[name]();
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key").value.trim();
    if (key) sessionStorage.setItem(KEY, key);
    $("key").value = "";
    checkKey().then((ok) => { if (ok) route(); });
  });
  $("key-forget").addEventListener("click", () => { sessionStorage.removeItem(KEY); showKeyState("key forgotten"); });
  $("create-form").addEventListener("submit", createCollection);
  $("collections-refresh").addEventListener("click", () => showCollections().catch(failed));
  $("search-form").addEventListener("submit", runSearch);
  $("answer-form").addEventListener("submit", ask);
  $("answer-stop").addEventListener("click", () => { if (answerAbort) answerAbort.abort(); });
  $("job-form").addEventListener("submit", submitJob);
  $("recall-collection").addEventListener("change", pollRecall);
  $("report-download").addEventListener("click", downloadReport);
  window.addEventListener("hashchange", route);
  checkKey(); // says whether the kept key (or none, on an open server) is accepted
  route();
});
