/* Mediaplane manager: what every page shares (window.MP).
 *
 * - MP.api(method, path, body?) → {status, ok, data, headers, error}: fetch against /api/v1 with
 *   the session cookie and X-CSRF-Token from the csrf_token cookie (interop.md 7.1). Never throws
 *   for an HTTP status; a 401 sends the browser to /login (the session ended).
 * - MP.dashboard(onUpdate): the /ws/dashboard stream (interop.md 6), reconnecting with backoff;
 *   onUpdate(payload) gets each dashboard_update's payload. The header's live dot follows it.
 * - MP.el(tag, attrs, ...children): builds DOM without innerHTML (no markup from data, ever).
 * - MP.can(role): whether the signed-in user is at least `role` (what the page shows; the
 *   server decides what is allowed).
 * - MP.toast(text, kind), MP.fmt.*: messages and number/time formatting.
 */
"use strict";

(function () {
  const ROLES = ["viewer", "operator", "admin", "super_admin"];
  const body = document.body;
  const role = body.dataset.role || "viewer";

  function cookie(name) {
    for (const part of document.cookie.split(";")) {
      const [key, ...rest] = part.trim().split("=");
      if (key === name) return decodeURIComponent(rest.join("="));
    }
    return "";
  }

  function can(needed) {
    return ROLES.indexOf(role) >= ROLES.indexOf(needed);
  }

  async function api(method, path, payload, options) {
    const headers = { Accept: "application/json" };
    const init = { method, headers, credentials: "same-origin" };
    if (payload !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = cookie("csrf_token") || "-";
    if (options && options.signal) init.signal = options.signal;
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      if (err && err.name === "AbortError") throw err;
      return { status: 0, ok: false, data: null, headers: new Headers(), error: "The manager cannot be reached" };
    }
    let data = null;
    const text = await response.text();
    if (text) {
      try { data = JSON.parse(text); } catch (_) { data = text; }
    }
    if (response.status === 401 && !(options && options.noRedirect) && body.dataset.page !== "login") {
      location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
    }
    let error = null;
    if (!response.ok) {
      error = (data && typeof data === "object" && data.error) || `HTTP ${response.status}`;
    }
    return { status: response.status, ok: response.ok, data, headers: response.headers, error };
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
      else if (value === true) node.setAttribute(key, "");
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function toast(text, kind) {
    const box = document.getElementById("toasts");
    if (!box) return;
    const item = el("div", { class: "toast" + (kind ? " toast-" + kind : ""), role: kind === "error" ? "alert" : "status" }, text);
    box.append(item);
    setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
  }

  const fmt = {
    bitrate(bps) {
      if (bps === null || bps === undefined) return "–";
      if (bps >= 1e9) return (bps / 1e9).toFixed(2) + " Gb/s";
      if (bps >= 1e6) return (bps / 1e6).toFixed(2) + " Mb/s";
      if (bps >= 1e3) return (bps / 1e3).toFixed(0) + " kb/s";
      return bps + " b/s";
    },
    duration(secs) {
      if (secs === null || secs === undefined) return "–";
      secs = Math.floor(secs);
      const d = Math.floor(secs / 86400), h = Math.floor((secs % 86400) / 3600), m = Math.floor((secs % 3600) / 60);
      if (d) return `${d}d ${h}h`;
      if (h) return `${h}h ${m}m`;
      if (m) return `${m}m ${secs % 60}s`;
      return `${secs}s`;
    },
    time(iso) {
      if (!iso) return "–";
      const when = new Date(iso);
      return isNaN(when) ? iso : when.toLocaleString(undefined, { hour12: false });
    },
    count(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString(); },
    bytes(n) {
      if (n === null || n === undefined) return "–";
      const units = ["B", "kB", "MB", "GB", "TB"];
      let value = Number(n), unit = 0;
      while (value >= 1000 && unit < units.length - 1) { value /= 1000; unit++; }
      return (unit ? value.toFixed(value >= 100 ? 0 : 1) : String(value)) + " " + units[unit];
    },
  };

  /* The dashboard stream: one socket per page, reconnecting 1, 2, 4 … 30 s. */
  function dashboard(onUpdate) {
    const dot = document.getElementById("live-indicator");
    let delay = 1000;
    let stopped = false;
    let socket = null;
    function setState(state) { if (dot) { dot.dataset.state = state; dot.title = state === "live" ? "Live updates" : "Live updates lost: reconnecting"; } }
    function open() {
      const scheme = location.protocol === "https:" ? "wss:" : "ws:";
      socket = new WebSocket(`${scheme}//${location.host}/ws/dashboard`);
      socket.onopen = () => { delay = 1000; setState("live"); };
      socket.onmessage = (message) => {
        let frame;
        try { frame = JSON.parse(message.data); } catch (_) { return; }
        if (frame && frame.type === "dashboard_update") onUpdate(frame.payload, frame.timestamp);
      };
      socket.onclose = () => {
        setState("lost");
        if (stopped) return;
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 30000);
      };
    }
    open();
    return { close() { stopped = true; if (socket) socket.close(); } };
  }

  /* A node's command through the normal route (interop.md 7.2): {ok, data, error}. */
  async function command(nodeId, action) {
    return api("POST", `/api/v1/nodes/${encodeURIComponent(nodeId)}/command`, { action });
  }

  /* A line diff of two texts (LCS; configs are small): [{op: "add"|"del"|"ctx", line}]. */
  function diffLines(before, after) {
    const a = before.split("\n"), b = after.split("\n");
    const n = a.length, m = b.length;
    const table = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
      table[i][j] = a[i] === b[j] ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
    const out = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { out.push({ op: "ctx", line: a[i] }); i++; j++; }
      else if (table[i + 1][j] >= table[i][j + 1]) out.push({ op: "del", line: a[i++] });
      else out.push({ op: "add", line: b[j++] });
    }
    while (i < n) out.push({ op: "del", line: a[i++] });
    while (j < m) out.push({ op: "add", line: b[j++] });
    return out;
  }

  function renderDiff(container, before, after) {
    container.replaceChildren(...diffLines(before, after).map((d) =>
      el("span", { class: d.op }, (d.op === "add" ? "+ " : d.op === "del" ? "- " : "  ") + d.line)));
  }

  /* The header: unacknowledged warning/critical count (GET /events/count), every 10 s. */
  async function refreshUnacked() {
    const badge = document.getElementById("unacked-count");
    if (!badge) return;
    const answer = await api("GET", "/api/v1/events/count");
    if (answer.ok && answer.data) {
      badge.textContent = String(answer.data.count);
      badge.hidden = !answer.data.count;
    }
  }

  const logout = document.getElementById("logout");
  if (logout) {
    logout.addEventListener("click", async () => {
      await api("POST", "/api/v1/auth/logout", undefined, { noRedirect: true });
      location.assign("/login");
    });
  }
  if (document.getElementById("unacked-count")) {
    refreshUnacked();
    setInterval(refreshUnacked, 10000);
  }

  window.MP = { api, can, role, el, toast, fmt, dashboard, command, diffLines, renderDiff, refreshUnacked, cookie };
})();
