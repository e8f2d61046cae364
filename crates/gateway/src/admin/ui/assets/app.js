// infergate fleet page.
//
// Polls the admin listener once a second while the page is visible —
// /debug/pools (replicas), /debug/traffic (pool rates and TTFT) and
// /debug/decisions (the sampled feed) — and draws them. No library: the
// DOM is built with createElement and textContent, never from HTML text,
// so the strict Content-Security-Policy holds and no value the gateway
// reports can inject markup. Sparklines are SVG drawn here; their history
// lives only in this page.

"use strict";

const POLL_MS = 1000;
const HISTORY = 90; // sparkline points, one per poll
const FEED_KEPT = 200; // decisions listed at most
const SCORERS = ["queue", "kv-cache", "inflight", "prefix", "lora", "speed", "session"];
const SCORER_LABEL = {
  queue: "queue",
  "kv-cache": "KV",
  inflight: "in-flight",
  prefix: "prefix",
  lora: "LoRA",
  speed: "speed",
  session: "session",
};
const BANDS = ["critical", "standard", "sheddable"];
const SVG_NS = "http://www.w3.org/2000/svg";

// ---------------------------------------------------------------------------
// DOM helpers

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null) continue;
    if (key === "class") node.className = value;
    else if (key === "data") Object.assign(node.dataset, value);
    else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value != null) node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child != null) node.append(child);
  }
  return node;
}

function setText(node, value) {
  const text = value == null ? "" : String(value);
  if (node.textContent !== text) node.textContent = text;
}

function replace(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c != null && c !== false));
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

// ---------------------------------------------------------------------------
// Formatting

function fmtMs(ms) {
  if (ms == null || Number.isNaN(ms)) return "—";
  if (ms < 10) return `${ms.toFixed(1)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

function fmtRate(perSecond) {
  if (perSecond == null) return "—";
  if (perSecond === 0) return "0";
  if (perSecond < 10) return perSecond.toFixed(1);
  return Math.round(perSecond).toLocaleString("en-US");
}

function fmtCount(n) {
  return n == null ? "—" : (Math.round(n) || 0).toLocaleString("en-US");
}

function fmtSeconds(s) {
  if (s < 90) return `${Math.round(s)} s`;
  return `${Math.round(s / 60)} min`;
}

function fmtClock(ms) {
  const d = new Date(ms);
  const two = (n) => String(n).padStart(2, "0");
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

function fmtScore(x) {
  return x == null ? "—" : x.toFixed(2);
}

// ---------------------------------------------------------------------------
// Replica health as the page shows it

const HEALTH_RANK = { fresh: 0, stale: 1, unhealthy: 2, unreachable: 3 };

function healthOf(e) {
  if (!e.reachable) return "unreachable";
  if (e.health === "healthy") return "fresh";
  return e.health; // "stale" or "unhealthy"
}

function troubleOf(health) {
  if (health === "unreachable" || health === "unhealthy") return "trouble";
  if (health === "stale") return "warn";
  return "";
}

// ---------------------------------------------------------------------------
// Small SVG drawings

function bar(fraction, width, color) {
  const f = Math.max(0, Math.min(1, fraction || 0));
  return svg(
    "svg",
    { width, height: 8, viewBox: `0 0 ${width} 8`, "aria-hidden": "true" },
    svg("rect", { width, height: 8, rx: 4, fill: cssVar("--track") }),
    f > 0 ? svg("rect", { width: Math.max(4, f * width), height: 8, rx: 4, fill: color }) : null,
  );
}

function kvColor(kv) {
  if (kv >= 0.9) return cssVar("--bad");
  if (kv >= 0.75) return cssVar("--warn");
  return cssVar("--kv-cache");
}

// The total is the weighted mean of the parts: each scorer's segment is
// its weighted part, so the segments add up to the total.
function scoreBar(scores, weights, width) {
  const sum = SCORERS.reduce((s, k) => s + (weights[k] || 0), 0) || 1;
  const parts = [];
  let x = 0;
  for (const k of SCORERS) {
    const w = ((weights[k] || 0) * (scores.parts[k] || 0) * width) / sum;
    if (w > 0) parts.push(svg("rect", { x, width: w, height: 8, fill: cssVar(`--${k}`) }));
    x += w;
  }
  const title = SCORERS.filter((k) => weights[k])
    .map((k) => `${SCORER_LABEL[k]} ${scores.parts[k].toFixed(2)} × weight ${weights[k]}`)
    .join("\n");
  return svg(
    "svg",
    { width, height: 8, viewBox: `0 0 ${width} 8`, role: "img" },
    svg("title", {}, `total ${scores.total.toFixed(3)}\n${title}`),
    svg("rect", { width, height: 8, rx: 2, fill: cssVar("--track") }),
    ...parts,
  );
}

function sparkline(history) {
  const w = 104;
  const h = 28;
  const n = HISTORY;
  const step = w / (n - 1);
  const offset = n - history.kv.length;
  const maxQueue = Math.max(1, ...history.waiting);
  const line = (values, scale, color) => {
    if (values.length < 2) return null;
    const points = values
      .map((v, i) => `${((offset + i) * step).toFixed(1)},${(h - 2 - (v / scale) * (h - 4)).toFixed(1)}`)
      .join(" ");
    return svg("polyline", {
      points,
      fill: "none",
      stroke: color,
      "stroke-width": 1.5,
      "stroke-linejoin": "round",
      "stroke-linecap": "round",
    });
  };
  const last = history.kv.length - 1;
  return svg(
    "svg",
    { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" },
    svg(
      "title",
      {},
      last >= 0
        ? `KV cache ${Math.round(history.kv[last] * 100)} %, engine queue ${history.waiting[last]} (peak ${maxQueue} in view)`
        : "",
    ),
    svg("line", { x1: 0, x2: w, y1: h - 2, y2: h - 2, stroke: cssVar("--border"), "stroke-width": 1 }),
    line(history.kv, 1, cssVar("--kv-cache")),
    line(history.waiting, maxQueue, cssVar("--queue")),
  );
}

// ---------------------------------------------------------------------------
// Pools and their replicas

const pools = new Map(); // name -> view
const view = { traffic: new Map(), lastOk: 0 };

const COLUMNS = [
  { key: "address", label: "Replica", sort: (e) => e.address },
  { key: "health", label: "Health", sort: (e) => HEALTH_RANK[healthOf(e)] },
  { key: "kv", label: "KV cache", sort: (e) => e.kvUsage ?? -1 },
  { key: "waiting", label: "Waiting", num: true, sort: (e) => e.waiting ?? -1, title: "requests queued in the replica's engine" },
  { key: "running", label: "Running", num: true, sort: (e) => e.running ?? -1, title: "requests in the replica's running batch" },
  { key: "inflight", label: "In flight", num: true, sort: (e) => e.inflightRequests, title: "requests this gateway has in flight to the replica" },
  { key: "unanswered", label: "Unanswered", num: true, sort: (e) => e.inflightUnanswered, title: "of those, the ones without a first byte yet" },
  { key: "adapters", label: "Adapters", sort: (e) => e.residentAdapters.length, title: "LoRA adapters resident on the replica" },
  { key: "prefix", label: "Prefix", num: true, sort: (e) => e.prefixIndexBlocks ?? 0, title: "prompt-prefix blocks the gateway remembers the replica holding" },
  { key: "score", label: "Score", sort: (e) => (e.scores ? e.scores.total : -1), title: "total score for a typical request, and each scorer's weighted part" },
  { key: "trend", label: "Trend", title: "KV cache use and engine queue, last 90 s" },
];

function statTile(label) {
  const value = el("div", { class: "value" });
  const sub = el("div", { class: "sub" });
  const node = el("div", { class: "stat" }, el("div", { class: "label" }, label), value, sub);
  return { node, value, sub };
}

function poolView(name) {
  const title = el("h2", {}, name);
  const engine = el("span", { class: "tag" });
  const policy = el("span", { class: "tag" });
  const weights = el("div", { class: "weights" });
  const stats = {
    ready: statTile("Replicas ready"),
    queued: statTile("Queued"),
    rate: statTile("Requests"),
    ttft: statTile("TTFT p50 · p95"),
    limited: statTile("Rate limited"),
    errors: statTile("Errors"),
  };
  const headRow = el("tr");
  const body = el("tbody");
  const table = el("table", { class: "grid replicas" }, el("thead", {}, headRow), body);
  const outcome = el("div", { class: "outcome" });
  // A disaggregated pool's prefill replicas (its table's are its decode replicas).
  const prefill = el("div", { class: "outcome hidden", data: { role: "prefill" } });
  const node = el(
    "section",
    { class: "card pool", data: { pool: name }, "aria-label": `pool ${name}` },
    el("div", { class: "card-head" }, title, engine, policy, weights),
    el("div", { class: "stats" }, Object.values(stats).map((s) => s.node)),
    el("div", { class: "scroll" }, table),
    prefill,
    outcome,
  );
  const v = { name, node, engine, policy, weights, stats, headRow, body, outcome, prefill, rows: new Map(), sort: null, heads: new Map(), scored: null };
  for (const col of COLUMNS) {
    const th = el("th", { class: col.num ? "num" : null, title: col.title, data: { col: col.key } });
    if (col.sort) {
      th.setAttribute("aria-sort", "none");
      th.append(el("button", { type: "button", on: { click: () => sortBy(v, col.key) } }, col.label));
    } else if (col.key === "trend") {
      th.append(
        el(
          "span",
          { class: "spark-legend" },
          el("span", {}, el("span", { class: "swatch", data: { scorer: "kv-cache" } }), " KV"),
          el("span", {}, el("span", { class: "swatch", data: { scorer: "queue" } }), " queue"),
        ),
      );
    } else {
      th.append(col.label);
    }
    v.heads.set(col.key, th);
    headRow.append(th);
  }
  return v;
}

function sortBy(v, key) {
  if (v.sort && v.sort.key === key) v.sort.dir = -v.sort.dir;
  else v.sort = { key, dir: key === "address" || key === "health" ? 1 : -1 };
  for (const [k, th] of v.heads) {
    if (th.hasAttribute("aria-sort")) {
      th.setAttribute("aria-sort", k !== key ? "none" : v.sort.dir > 0 ? "ascending" : "descending");
    }
  }
  orderRows(v);
}

function orderRows(v) {
  const rows = [...v.rows.values()];
  if (v.sort) {
    const col = COLUMNS.find((c) => c.key === v.sort.key);
    rows.sort((a, b) => {
      const x = col.sort(a.data);
      const y = col.sort(b.data);
      const c = typeof x === "string" ? x.localeCompare(y) : x - y;
      return c * v.sort.dir || a.order - b.order;
    });
  } else {
    rows.sort((a, b) => a.order - b.order);
  }
  rows.forEach((row) => v.body.append(row.node)); // moves, keeps nodes
}

function replicaRow(address) {
  const cells = {};
  const node = el("tr", { class: "replica", data: { address } });
  for (const col of COLUMNS) {
    cells[col.key] = el("td", { class: col.num ? "num" : null, data: { col: col.key } });
    node.append(cells[col.key]);
  }
  const role = el("span", { class: "tag hidden", data: { role: "" } });
  cells.address.append(el("span", { class: "addr" }, address), " ", role);
  const err = el("div", { class: "err" });
  return { node, cells, err, role, history: { kv: [], waiting: [] }, order: 0, data: null };
}

function updateRow(row, e, pool) {
  row.data = e;
  const c = row.cells;
  // Only disaggregated pools have roles worth showing.
  setText(row.role, e.role || "");
  row.role.dataset.role = e.role || "";
  row.role.classList.toggle("hidden", !e.role || e.role === "both");
  const health = healthOf(e);
  row.node.className = `replica ${troubleOf(health)}`.trim();
  row.node.dataset.health = health;

  setText(row.err, e.lastError ? e.lastError : "");
  row.err.title = e.lastError || "";
  row.err.classList.toggle("hidden", !e.lastError);

  const age = e.lastGoodScrapeAgeMs;
  const badge = el("span", { class: `health ${health}` }, health);
  badge.title = age != null ? `last good scrape ${fmtMs(age)} ago` : "no good scrape yet";
  replace(c.health, badge, row.err);

  if (e.kvUsage == null) replace(c.kv, el("span", { class: "faint" }, "—"));
  else {
    replace(
      c.kv,
      el("span", { class: "meter" }, bar(e.kvUsage, 48, kvColor(e.kvUsage)), el("span", { class: "pct" }, `${Math.round(e.kvUsage * 100)}%`)),
    );
  }
  setText(c.waiting, fmtCount(e.waiting));
  setText(c.running, fmtCount(e.running));
  setText(c.inflight, fmtCount(e.inflightRequests));
  setText(c.unanswered, fmtCount(e.inflightUnanswered));
  replace(
    c.adapters,
    e.residentAdapters.length
      ? el("span", { class: "chips" }, e.residentAdapters.map((a) => el("span", { class: "chip" }, a)))
      : el("span", { class: "faint" }, "—"),
  );
  setText(c.prefix, fmtCount(e.prefixIndexBlocks));

  if (e.scores) {
    replace(c.score, el("span", { class: "score" }, el("span", { class: "total" }, fmtScore(e.scores.total)), scoreBar(e.scores, pool.weights, 80)));
  } else {
    replace(c.score, el("span", { class: "faint", title: "not a candidate for a typical request: stale, failing, unreachable or saturated" }, "—"));
  }

  const h = row.history;
  h.kv.push(e.kvUsage ?? 0);
  h.waiting.push(e.waiting ?? 0);
  if (h.kv.length > HISTORY) {
    h.kv.shift();
    h.waiting.shift();
  }
  replace(c.trend, el("span", { class: "spark" }, sparkline(h)));
}

function updatePool(v, pool) {
  setText(v.engine, pool.engine);
  setText(v.policy, pool.policy);
  const scored = pool.endpoints.some((e) => "scores" in e);
  if (scored !== v.scored) {
    v.scored = scored;
    v.heads.get("score").classList.toggle("hidden", !scored);
    v.weights.classList.toggle("hidden", !scored);
  }
  replace(
    v.weights,
    SCORERS.map((k) =>
      el("span", { class: "w", title: `weight of the ${SCORER_LABEL[k]} scorer` }, el("span", { class: "swatch", data: { scorer: k } }), SCORER_LABEL[k], " ", el("b", {}, String(pool.weights[k]))),
    ),
  );

  const d = pool.disaggregation;
  v.prefill.classList.toggle("hidden", !d);
  if (d) {
    replace(
      v.prefill,
      el("span", { class: "tag" }, `${d.protocol} disaggregation`),
      ` decider: prefill remotely from ${fmtCount(d.minUncachedTokens)} uncached tokens · prefill replicas: `,
      d.prefill.map((p) =>
        el("span", { class: "chip", title: `${p.inflightRequests} prefill legs in flight` }, `${p.address} · ${fmtCount(p.outstandingTokens)} tokens outstanding`),
      ),
    );
  }

  // Replicas: keep each row (and its history) by address.
  const seen = new Set();
  pool.endpoints.forEach((e, i) => {
    seen.add(e.address);
    let row = v.rows.get(e.address);
    if (!row) {
      row = replicaRow(e.address);
      v.rows.set(e.address, row);
    }
    row.order = i;
    updateRow(row, e, pool);
    row.cells.score.classList.toggle("hidden", !scored);
  });
  for (const [address, row] of v.rows) {
    if (!seen.has(address)) {
      row.node.remove();
      v.rows.delete(address);
    }
  }
  orderRows(v);

  // Pool figures.
  const total = pool.endpoints.length;
  const ready = pool.endpoints.filter((e) => e.ready).length;
  const s = v.stats;
  replace(s.ready.value, String(ready), " ", el("small", {}, `/ ${total}`));
  setText(s.ready.sub, pool.ready ? "the pool can take requests" : "no replica can take requests");
  s.ready.node.className = `stat ${ready === 0 ? "bad" : ready < total ? "warn" : ""}`.trim();

  const queued = BANDS.map((b) => (pool.queued[b] ? pool.queued[b].requests : 0));
  const queuedTotal = queued.reduce((a, b) => a + b, 0);
  setText(s.queued.value, fmtCount(queuedTotal));
  const waiting = BANDS.flatMap((b, i) => (queued[i] > 0 ? [`${queued[i]} ${b}`] : []));
  setText(s.queued.sub, waiting.length ? waiting.join(" · ") : "nothing waits for a replica");
  s.queued.sub.title = BANDS.map((b, i) => `${b}: ${queued[i]}`).join("\n");
  s.queued.node.className = `stat ${queuedTotal > 0 ? "warn" : ""}`.trim();

  const t = view.traffic.get(pool.name);
  if (t) {
    const win = t.window;
    const span = `last ${fmtSeconds(win.seconds)}`;
    replace(s.rate.value, fmtRate(t.recent.perSecond), el("small", {}, "/s"));
    setText(s.rate.sub, `${fmtCount(win.requests)} in the ${span}`);
    replace(s.ttft.value, fmtMs(win.ttftMs.p50), el("span", { class: "sep" }, "·"), fmtMs(win.ttftMs.p95));
    setText(s.ttft.sub, `${fmtCount(win.ttftMs.count)} answers, ${span}`);
    setText(s.limited.value, fmtCount(win.rateLimited));
    setText(s.limited.sub, `429s, ${span}`);
    s.limited.node.className = `stat ${win.rateLimited > 0 ? "warn" : ""}`.trim();
    setText(s.errors.value, fmtCount(win.serverErrors));
    const moves = win.migrations || { moved: 0, notMoved: 0 };
    const moved = [
      win.clientClosed ? `${fmtCount(win.clientClosed)} clients left` : "",
      moves.moved ? `${fmtCount(moves.moved)} answers moved off failing replicas` : "",
      moves.notMoved ? `${fmtCount(moves.notMoved)} could not move` : "",
      t.migrating ? `${fmtCount(t.migrating)} moving now` : "",
    ].filter(Boolean);
    setText(s.errors.sub, [`5xx, ${span}`, ...moved].join(" · "));
    s.errors.node.className = `stat ${win.serverErrors > 0 ? "bad" : ""}`.trim();
  }

  const outcome = pool.typicalRequest ? pool.typicalRequest.outcome : "";
  setText(v.outcome, outcome ? `A typical request now: ${outcome}` : "");
}

function renderPools(data) {
  const container = document.getElementById("pools");
  const names = new Set();
  for (const pool of data.pools) {
    names.add(pool.name);
    let v = pools.get(pool.name);
    if (!v) {
      v = poolView(pool.name);
      pools.set(pool.name, v);
    }
    container.append(v.node); // config order
    updatePool(v, pool);
  }
  for (const [name, v] of pools) {
    if (!names.has(name)) {
      v.node.remove();
      pools.delete(name);
    }
  }
  setFilterOptions(filterPool, data.pools.map((p) => p.name));

  // The top bar.
  const endpoints = data.pools.flatMap((p) => p.endpoints);
  const ready = endpoints.filter((e) => e.ready).length;
  const inflight = endpoints.reduce((a, e) => a + e.inflightRequests, 0);
  const rate = [...view.traffic.values()].reduce((a, t) => a + t.recent.perSecond, 0);
  const overview = document.getElementById("overview");
  replace(
    overview,
    el("span", {}, el("b", {}, String(data.pools.length)), data.pools.length === 1 ? " pool" : " pools"),
    el("span", {}, el("b", {}, `${ready}/${endpoints.length}`), " replicas ready"),
    el("span", {}, el("b", {}, fmtRate(rate)), " requests/s"),
    el("span", {}, el("b", {}, fmtCount(inflight)), " in flight"),
  );
}

// ---------------------------------------------------------------------------
// The decision feed

const feed = {
  after: 0,
  rows: [], // newest first: { node, entry }
  models: new Set(),
  tenants: false,
};
const feedTable = () => document.getElementById("feed");
const filterPool = document.getElementById("filter-pool");
const filterModel = document.getElementById("filter-model");

function setFilterOptions(select, values) {
  const have = new Set([...select.options].map((o) => o.value));
  for (const value of values) {
    if (!have.has(value)) select.append(el("option", { value }, value));
  }
}

function statusClass(status) {
  if (status >= 200 && status < 300) return "status-ok";
  if (status === 429 || status === 499) return "status-warn";
  return "status-bad";
}

function gapText(d) {
  if (d.fallback) return "fallback";
  if (d.gap != null) return `+${d.gap.toFixed(2)}`;
  if (d.score != null) return "alone";
  return "—";
}

function feedRow(d) {
  const id = el("button", { type: "button", class: "id", title: "show the full decision record", on: { click: () => openRecord(d.requestId) } }, shortId(d.requestId));
  const node = el(
    "tr",
    { class: "new", data: { requestId: d.requestId, pool: d.pool || "", model: d.model || "" } },
    el("td", { class: "muted" }, fmtClock(d.atMs)),
    el("td", {}, id),
    el("td", {}, d.model || "—"),
    el("td", { class: "tenant" }, d.tenant || "—"),
    el("td", {}, el("span", { class: `band ${d.band || ""}` }, d.band || "—")),
    el("td", { class: "addr", title: d.pool ? `pool ${d.pool}` : null }, d.endpoint || "—"),
    el("td", { class: "addr muted" }, d.runnerUp || "—"),
    el("td", { class: "num", title: d.score != null ? `${fmtScore(d.score)} vs ${fmtScore(d.runnerUpScore)}` : null }, gapText(d)),
    el("td", { class: "num" }, fmtMs(d.queueWaitMs)),
    el("td", { class: "num" }, fmtMs(d.ttftMs)),
    el("td", { class: `num ${statusClass(d.status)}`, title: d.error || null }, String(d.status)),
  );
  return node;
}

function shortId(id) {
  return id.length > 20 ? `${id.slice(0, 8)}…${id.slice(-6)}` : id;
}

function visible(entry) {
  return (!filterPool.value || entry.pool === filterPool.value) && (!filterModel.value || entry.model === filterModel.value);
}

function applyFilter() {
  let shown = 0;
  for (const row of feed.rows) {
    const show = visible(row.entry);
    row.node.classList.toggle("hidden", !show);
    if (show) shown += 1;
  }
  document.getElementById("feed-empty").classList.toggle("hidden", shown > 0);
}

function renderFeed(data) {
  const body = feedTable().tBodies[0];
  const sampling = data.sampling;
  setText(
    document.getElementById("feed-hint"),
    `Sampled while this page is open: up to ${sampling.perSecond} requests a second, the last ${sampling.capacity} kept.`,
  );
  // Sequence numbers start again when the gateway restarts.
  if (data.next < feed.after) feed.after = 0;
  for (const d of data.decisions) {
    if (d.seq <= feed.after) continue;
    const node = feedRow(d);
    body.prepend(node);
    feed.rows.unshift({ node, entry: d });
    if (d.model && !feed.models.has(d.model)) {
      feed.models.add(d.model);
      setFilterOptions(filterModel, [d.model]);
    }
    if (d.tenant && !feed.tenants) {
      feed.tenants = true;
      feedTable().classList.add("with-tenants");
    }
  }
  feed.after = Math.max(feed.after, data.next);
  while (feed.rows.length > FEED_KEPT) feed.rows.pop().node.remove();
  applyFilter();
}

// ---------------------------------------------------------------------------
// One decision's full record

function field(label, value, cls) {
  return el("div", {}, el("dt", {}, label), el("dd", { class: cls || null }, value == null || value === "" ? "—" : value));
}

async function openRecord(id) {
  const dialog = document.getElementById("record");
  const body = document.getElementById("record-body");
  replace(document.getElementById("record-title"), "Request ", el("span", { class: "mono" }, id));
  replace(body, el("p", { class: "muted" }, "Loading…"));
  if (!dialog.open) dialog.showModal();
  let r;
  try {
    const res = await fetch(`../debug/decisions/${encodeURIComponent(id)}`, { cache: "no-store" });
    r = await res.json();
    if (!res.ok) throw new Error(r.error ? r.error.message : res.statusText);
  } catch (err) {
    replace(body, el("p", { class: "error" }, String(err.message || err)));
    return;
  }
  const tokens = r.promptTokens != null || r.completionTokens != null ? `${fmtCount(r.promptTokens)} prompt · ${fmtCount(r.completionTokens)} completion` : null;
  const fields = el(
    "dl",
    { class: "fields" },
    field("Time", new Date(r.atMs).toLocaleString()),
    field("Model", r.model),
    field("Pool", r.pool),
    field("Band", r.band),
    r.tenant ? field("Tenant", r.tenant) : null,
    field("Status", String(r.status), statusClass(r.status)),
    field("Chosen", r.endpoint, "mono"),
    field("Runner-up", r.runnerUp, "mono"),
    field("Score", r.score != null ? `${fmtScore(r.score)}${r.runnerUpScore != null ? ` vs ${fmtScore(r.runnerUpScore)}` : " (alone)"}` : null),
    field("Queue wait", fmtMs(r.queueWaitMs)),
    field("TTFT", fmtMs(r.ttftMs)),
    field("Duration", fmtMs(r.durationMs)),
    field("Stream", r.stream ? "yes" : "no"),
    field("Retries", String(r.retries)),
    r.moved && r.moved.length ? field("Moved", r.moved.map((m) => `off ${m.from} (${m.reason}) after ${fmtCount(m.tokens)} tokens`).join("; "), "mono") : null,
    field("Tokens", tokens),
    field("Policy", r.policy ? `${r.policy}${r.fallback ? " (least-request fallback)" : ""}` : null),
    field("Trace id", r.traceId, "mono"),
    r.error ? field("Error", r.error, "error") : null,
  );
  let candidates;
  if (r.candidates.length) {
    const rows = r.candidates.map((c) =>
      el(
        "tr",
        { class: c.address === r.endpoint ? "chosen" : null },
        el("td", { class: "mono" }, c.address, c.address === r.endpoint ? el("span", { class: "tag" }, "chosen") : null),
        el("td", { class: "num" }, fmtScore(c.total)),
        SCORERS.map((k) => el("td", {}, el("span", { class: "meter" }, bar(c.parts[k], 48, cssVar(`--${k}`)), el("span", { class: "pct" }, c.parts[k].toFixed(2))))),
      ),
    );
    const more = r.candidatesScored - r.candidates.length;
    candidates = [
      el("h3", {}, `Candidates, best first (${r.candidatesScored} scored)`),
      el(
        "div",
        { class: "scroll" },
        el(
          "table",
          { class: "grid" },
          el("thead", {}, el("tr", {}, el("th", {}, "Replica"), el("th", { class: "num" }, "Total"), SCORERS.map((k) => el("th", {}, SCORER_LABEL[k])))),
          el("tbody", {}, rows),
        ),
      ),
      more > 0 ? el("p", { class: "muted" }, `and ${more} more`) : null,
    ];
  } else {
    candidates = el("p", { class: "muted" }, "No candidate scores: the pool's policy does not score replicas, or the request ended before a replica was picked.");
  }
  replace(body, fields, candidates);
}

// ---------------------------------------------------------------------------
// Polling

function setConnection(state, text) {
  const node = document.getElementById("connection");
  node.dataset.state = state;
  setText(document.getElementById("connection-text"), text);
}

async function getJSON(path) {
  const res = await fetch(path, { cache: "no-store", signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new Error(`${path}: ${res.status}`);
  return res.json();
}

let polling = false;
let timer = null;

async function poll() {
  clearTimeout(timer);
  if (document.hidden) {
    // Nothing is asked while nobody looks, so the gateway records nothing.
    setConnection("paused", "paused while the page is hidden");
    return;
  }
  if (polling) return;
  polling = true;
  try {
    const [p, t, d] = await Promise.allSettled([
      getJSON("../debug/pools"),
      getJSON("../debug/traffic"),
      getJSON(`../debug/decisions?after=${feed.after}&limit=${FEED_KEPT}`),
    ]);
    if (t.status === "fulfilled") view.traffic = new Map(t.value.pools.map((x) => [x.name, x]));
    if (p.status === "fulfilled") renderPools(p.value);
    if (d.status === "fulfilled") renderFeed(d.value);
    if (p.status === "fulfilled") {
      view.lastOk = Date.now();
      setConnection("live", `live · updated ${fmtClock(view.lastOk)}`);
    } else {
      setConnection("down", `cannot reach the gateway${view.lastOk ? ` since ${fmtClock(view.lastOk)}` : ""} — retrying`);
    }
  } finally {
    polling = false;
    timer = setTimeout(poll, POLL_MS);
  }
}

filterPool.addEventListener("change", applyFilter);
filterModel.addEventListener("change", applyFilter);
document.getElementById("record-close").addEventListener("click", () => document.getElementById("record").close());
document.getElementById("record").addEventListener("click", (ev) => {
  if (ev.target === ev.currentTarget) ev.currentTarget.close(); // a click on the backdrop
});
document.addEventListener("visibilitychange", poll);
poll();
