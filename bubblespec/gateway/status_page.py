"""The gateway's status page at `/`: the cluster and the last steps' per-rank timelines.

One self-contained HTML page (no external scripts, styles or fonts: it works offline and
behind a proxy prefix, since it fetches relative URLs). Its script polls the gateway's JSON
routes, `GET v1/ranks` (ranks, their state and weight version; the current step) and
`GET v1/steps/{step}` for the last few steps, and draws per step and rank a bar of
decode (busy) time, then the bubble split into pre-generation and idle time, all on one time
scale, refreshed every `refresh_s` seconds. A step still running is drawn with its figures so
far. DOM built with textContent/attributes only (rank ids and errors are never parsed as HTML).

Hooks for tests and scripts: `body[data-state]` is "loading", then "ready" after the first
complete refresh, "error" when a refresh failed; `body[data-updates]` counts refreshes;
every chart row is `g.rank-row[data-step][data-rank]` with `data-decode-s`, `data-pregen-s`,
`data-idle-s`; every rank table row is `tr[data-rank]`.

    install_status_page(app)          # GET / -> the page (not in the OpenAPI schema)
"""

from __future__ import annotations

import json
from typing import Any

STYLE = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:24px;
align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0}
.kv{opacity:.9}.kv b{font-weight:600}
main{padding:12px 20px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 14px;
margin-bottom:14px}
h2{font-size:15px;margin:2px 0 8px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;white-space:nowrap}
th{font-weight:600;color:#566;font-size:12px;text-transform:uppercase}
td.err{white-space:normal;color:#b3261e}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;color:#fff;
background:#8a94a6}
.s-decoding{background:#2f6fde}.s-pregen{background:#e08a00}.s-idle{background:#3c9a5f}
.s-updating_weights{background:#7b4fd6}.s-starting{background:#8a94a6}
.s-engine_dead{background:#c62828}
.s-lost,.s-unreachable,.s-error{background:#b3261e}
.ok{color:#3c9a5f}.bad{color:#b3261e}
#banner{display:none;background:#fde7e7;color:#b3261e;padding:6px 20px}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
svg text{font-size:12px;fill:#1d2330}
svg .step-title{font-weight:600}
svg .muted{fill:#6b7385}
.c-decode{fill:#2f6fde}.c-pregen{fill:#e08a00}.c-idle{fill:#d3d8e0}
"""

SCRIPT = r"""
(function () {
  "use strict";
  const CFG = __CONFIG__;
  const SVGNS = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  let updates = 0;

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  const fmtS = (s) => (s === null || s === undefined) ? "-" :
    (s >= 100 ? s.toFixed(0) : s >= 10 ? s.toFixed(1) : s.toFixed(2)) + " s";
  const pct = (x) => (x === null || x === undefined || !isFinite(x)) ? "-" :
    (100 * x).toFixed(0) + "%";

  async function getJSON(url) {
    const r = await fetch(url, {cache: "no-store", headers: {"Accept": "application/json"}});
    if (!r.ok) {
      const err = new Error(url + ": HTTP " + r.status);
      err.status = r.status;
      throw err;
    }
    return r.json();
  }

  function renderCluster(info) {
    $("sync").textContent = info.sync_ok ? "reachable" : ("unreachable: " +
      (info.sync_error || "?"));
    $("sync").className = info.sync_ok ? "ok" : "bad";
    $("cur-step").textContent = info.current_step ?? "-";
    $("last-step").textContent = info.last_step ?? "-";
    $("ready").textContent = info.ready + " / " + info.ranks.length;
    const body = $("ranks-body");
    body.replaceChildren();
    if (!info.ranks.length) {
      const tr = el("tr");
      tr.appendChild(el("td", {colspan: 8}, "no ranks known yet"));
      body.appendChild(tr);
    }
    for (const r of info.ranks) {
      const tr = el("tr", {"data-rank": r.rank_id});
      tr.appendChild(el("td", {}, r.rank_id));
      const st = r.error ? "unreachable" : (r.state || r.sync_state || "?");
      const td = el("td");
      td.appendChild(el("span", {class: "badge s-" + st.replace(/[^a-z_]/g, "")}, st));
      tr.appendChild(td);
      tr.appendChild(el("td", {}, r.sync_state || "-"));
      tr.appendChild(el("td", {class: "weight-version"}, r.weight_version ?? "-"));
      tr.appendChild(el("td", {}, r.step ?? "-"));
      tr.appendChild(el("td", {}, r.last_heartbeat_age_s === null ||
        r.last_heartbeat_age_s === undefined ? "-" : r.last_heartbeat_age_s.toFixed(1) + " s"));
      tr.appendChild(el("td", {}, r.url));
      tr.appendChild(el("td", {class: "err"}, r.error || ""));
      body.appendChild(tr);
    }
  }

  function stepTitle(s) {
    const t = s.timeline, ro = s.rollout;
    const parts = ["step " + s.step, t && !t.complete ? "running" : "done"];
    if (t) parts.push(fmtS(t.wall_s), "bubble " + pct(t.bubble_fraction),
                      "recovered " + pct(t.pregen_share), t.pregen_tokens + " pre-gen tokens");
    if (ro && ro.counters) {
      const k = ro.counters;
      if (k.num_draft_tokens) parts.push("acceptance " +
        pct(k.num_accepted_tokens / k.num_draft_tokens));
      if (k.tokens_per_forward) parts.push(k.tokens_per_forward.toFixed(2) + " tok/fwd");
    }
    return parts.join(" \u00b7 ");
  }

  function rowsOf(s) {
    if (s.timeline) return s.timeline.ranks.map((r) => ({
      rank: r.rank_id, decode: r.busy_s, pregen: r.pregen_s, idle: r.idle_s,
      tokens: r.pregen_tokens, requests: r.num_requests}));
    // no synchronizer timeline: the gateway's own per-rank decode seconds
    const ro = s.rollout;
    if (!ro) return [];
    const wall = ro.wall_s || 0;
    return ro.ranks.map((r) => ({rank: r.rank_id, decode: r.decode_seconds || 0, pregen: 0,
      idle: Math.max(0, wall - (r.decode_seconds || 0)), tokens: 0,
      requests: r.num_samples}));
  }

  function renderChart(steps) {
    const svg = $("chart");
    svg.replaceChildren();
    const W = Math.max(480, (svg.parentNode.clientWidth || 900) - 4);
    const labelW = 90, rightPad = 70, rowH = 18, gap = 4;
    const scaleMax = Math.max(1e-9, ...steps.map((s) => rowsOf(s).reduce(
      (m, r) => Math.max(m, r.decode + r.pregen + r.idle), 0)));
    const xs = (sec) => (W - labelW - rightPad) * sec / scaleMax;
    let y = 4;
    if (!steps.length) {
      svg.appendChild(sv("text", {x: 4, y: 18, class: "muted", id: "no-steps"},
        "no steps yet: waiting for the first rollout"));
      y = 30;
    }
    for (const s of steps) {
      const g = sv("g", {class: "step", "data-step": s.step,
        "data-complete": s.timeline ? String(s.timeline.complete) : "unknown"});
      g.appendChild(sv("text", {x: 0, y: y + 13, class: "step-title"}, stepTitle(s)));
      y += 20;
      for (const r of rowsOf(s)) {
        const row = sv("g", {class: "rank-row", "data-step": s.step, "data-rank": r.rank,
          "data-decode-s": r.decode.toFixed(4), "data-pregen-s": r.pregen.toFixed(4),
          "data-idle-s": r.idle.toFixed(4)});
        row.appendChild(sv("text", {x: 0, y: y + 13}, r.rank));
        let x = labelW;
        for (const [kind, sec] of [["decode", r.decode], ["pregen", r.pregen],
                                   ["idle", r.idle]]) {
          const w = xs(sec);
          const rect = sv("rect", {x: x.toFixed(1), y: y, width: Math.max(0, w).toFixed(1),
            height: rowH, class: "c-" + kind, "data-kind": kind});
          rect.appendChild(sv("title", {}, r.rank + " " + kind + ": " + fmtS(sec) +
            (kind === "pregen" ? " (" + r.tokens + " tokens)" : "")));
          row.appendChild(rect);
          x += w;
        }
        row.appendChild(sv("text", {x: (x + 6).toFixed(1), y: y + 13, class: "muted"},
          fmtS(r.decode + r.pregen + r.idle)));
        g.appendChild(row);
        y += rowH + gap;
      }
      y += 10;
      svg.appendChild(g);
    }
    svg.setAttribute("width", W);
    svg.setAttribute("height", y);
    svg.setAttribute("viewBox", "0 0 " + W + " " + y);
  }

  async function loadSteps(info) {
    const top = Math.max(info.current_step ?? -1, info.last_step ?? -1);
    const wanted = [];
    for (let s = top; s >= 0 && wanted.length < CFG.steps; s--) wanted.push(s);
    const got = await Promise.all(wanted.map((s) => getJSON("v1/steps/" + s).catch((e) => {
      if (e.status === 404 || e.status === 503) return null;  // not (yet / any more) known
      throw e;
    })));
    return got.filter((s) => s && (s.timeline || s.rollout));
  }

  async function refresh() {
    try {
      const info = await getJSON("v1/ranks");
      renderCluster(info);
      const steps = await loadSteps(info);
      renderChart(steps);
      updates += 1;
      document.body.dataset.updates = String(updates);
      document.body.dataset.state = "ready";
      $("banner").style.display = "none";
      $("updated").textContent = new Date().toLocaleTimeString();
    } catch (e) {
      document.body.dataset.state = "error";
      $("banner").textContent = "refresh failed: " + e.message;
      $("banner").style.display = "block";
    }
    if (CFG.refresh_ms > 0) setTimeout(refresh, CFG.refresh_ms);
  }
  refresh();
})();
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title><style>__STYLE__</style></head>
<body data-state="loading" data-updates="0">
<header><h1>__TITLE__</h1>
<span class="kv">synchronizer: <b id="sync">-</b></span>
<span class="kv">current step: <b id="cur-step">-</b></span>
<span class="kv">last rollout: <b id="last-step">-</b></span>
<span class="kv">ranks ready: <b id="ready">-</b></span>
<span class="kv">updated: <b id="updated">-</b></span></header>
<div id="banner"></div>
<main>
<section><h2>Ranks</h2><table id="ranks"><thead><tr><th>rank</th><th>state</th>
<th>synchronizer</th><th>weights</th><th>step</th><th>heartbeat</th><th>address</th>
<th>error</th></tr></thead><tbody id="ranks-body"></tbody></table></section>
<section><h2>Last steps: per-rank timeline</h2>
<div class="legend"><span><i class="c-decode" style="background:#2f6fde"></i>decode</span>
<span><i style="background:#e08a00"></i>pre-generation (bubble)</span>
<span><i style="background:#d3d8e0"></i>idle (bubble)</span>
<span class="muted">one time scale for all steps; a step still running shows its
figures so far</span></div>
<div id="chart-box"><svg id="chart" xmlns="http://www.w3.org/2000/svg" width="900"
height="40" role="img" aria-label="per-rank step timelines"></svg></div></section>
</main>
<script>__SCRIPT__</script>
</body></html>
"""


def render_page(title: str = "bubblespec", steps: int = 6, refresh_s: float = 2.0) -> str:
    """The page's HTML (`steps` last steps drawn, refreshed every `refresh_s`; 0 = never)."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    config = {"steps": int(steps), "refresh_ms": int(max(0.0, refresh_s) * 1000)}
    safe_title = (title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    script = SCRIPT.replace("__CONFIG__", json.dumps(config))
    return (PAGE.replace("__STYLE__", STYLE).replace("__SCRIPT__", script)
            .replace("__TITLE__", safe_title))


def install_status_page(app: Any, *, path: str = "/", title: str = "bubblespec",
                        steps: int = 6, refresh_s: float = 2.0) -> None:
    """Serve the status page at `path` on a FastAPI `app` that has the gateway's
    `GET /v1/ranks` and `GET /v1/steps/{step}` routes (the page fetches them relative to
    itself, so `path` must sit beside them: "/" or "/status")."""
    from fastapi.responses import HTMLResponse

    html = render_page(title, steps, refresh_s)

    @app.get(path, include_in_schema=False, response_class=HTMLResponse)
    async def status_page() -> HTMLResponse:
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})
