/* The fleet overview (issue 21): every node the user may see, live.
 *
 * Sources (interop.md 6, 7.2): GET /api/v1/nodes gives every row (pending and offline nodes
 * included, last_seen_at); the /ws/dashboard stream's dashboard_update gives status, stats,
 * health, versions and uptime about once a second. Both merge into one Map of per-node state;
 * the REST list is read again every 30 s, when the stream names a node it does not know (or
 * stops naming one it knows), and after an add or a delete.
 *
 * Scale (200 nodes and more): the table is paginated (50 rows a page). An update touches the
 * Map, the summary strip and only the rows on screen; each node keeps one <tr> for its life,
 * whose cells are written only when their text changes, and the <tbody> is rebuilt only when
 * the order or the page changes.
 *
 * Test hook, kept tiny on purpose (tests/e2e/test_dashboard_scale.py): after applying each
 * dashboard_update the page pushes performance.now() to window.__mpFleetUpdates, the time the
 * apply took (ms) to window.__mpFleetApplyMs and the frame's own timestamp (epoch ms, the
 * manager's clock) to window.__mpFleetSentAt; each keeps its last 600 entries.
 */
"use strict";

(function () {
  const { api, el, toast, fmt } = MP;
  const $ = (id) => document.getElementById(id);
  const CAN_ADMIN = document.body.dataset.canAdmin === "true";
  const PER_PAGE = 50;
  const REFRESH_MS = 30000;
  const REFRESH_GAP_MS = 3000; // the stream asks for the REST list at most this often
  const STREAM_FRESH_MS = 10000; // the stream's status wins over the REST row for this long
  const HEALTHS = ["Healthy", "Warning", "Error", "Critical"];
  const HEALTH_LABEL = { Healthy: "ok", Warning: "warn", Error: "err", Critical: "crit" };
  const STATUSES = ["online", "degraded", "error", "offline", "pending"];
  const STATUS_RANK = { error: 0, degraded: 1, offline: 2, pending: 3, online: 4 };
  const ATTENTION = new Set(["degraded", "error", "offline"]);
  const CONNECTED = new Set(["online", "degraded", "error"]);
  const NUMERIC = new Set(["uptime", "flows", "bitrate", "seen"]); // first click sorts these high to low
  const HISTORY = 600;
  // One formatter for every "last seen" tooltip: toLocaleString() builds a new one per call,
  // which costs ~0.2 ms each, 50 times a second.
  const STAMP = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium", hour12: false });

  const nodes = new Map(); // id -> per-node state (see blank())
  const rows = new Map(); // id -> {tr, cells, last}: one row element per node, reused
  let shown = []; // the row elements in the tbody now, in order
  let loaded = false;
  let page = 0;
  let sortKey = "name";
  let sortDir = 1;
  let deleting = null;

  const search = $("fleet-search");
  const statusFilter = $("fleet-status");
  const typeFilter = $("fleet-type");
  const tbody = $("fleet-body");
  const columns = CAN_ADMIN ? 9 : 8;

  window.__mpFleetUpdates = [];
  window.__mpFleetApplyMs = [];
  window.__mpFleetSentAt = [];

  /* ---------------------------------------------------------------- state */
  function blank(id) {
    return {
      id, name: id, type: "edge", status: "pending", version: null, uptime: null,
      flows: null, bitrate: null, seen: null, streamAt: 0,
    };
  }

  function flowSummary(stats) {
    if (!stats || !Array.isArray(stats.flows)) return null;
    const sum = { total: 0, running: 0, Healthy: 0, Warning: 0, Error: 0, Critical: 0, bitrate: 0 };
    for (const flow of stats.flows) {
      if (!flow) continue;
      sum.total += 1;
      if (flow.state === "Running") sum.running += 1;
      if (HEALTHS.includes(flow.health)) sum[flow.health] += 1;
      const rate = flow.input && flow.input.bitrate_bps;
      if (typeof rate === "number" && rate > 0) sum.bitrate += rate;
    }
    return sum;
  }

  function mergeRest(row, now) {
    const node = nodes.get(row.id) || blank(row.id);
    node.name = row.name;
    node.type = row.device_type;
    if (now - node.streamAt > STREAM_FRESH_MS) {
      node.status = row.status;
      node.version = row.software_version;
      if (!CONNECTED.has(row.status)) { node.uptime = null; node.flows = null; node.bitrate = null; }
    }
    const seen = row.last_seen_at ? Date.parse(row.last_seen_at) : null;
    if (seen && (!node.seen || seen > node.seen)) node.seen = seen;
    nodes.set(row.id, node);
  }

  function mergeStream(item, seenAt, now) {
    const node = nodes.get(item.node_id) || blank(item.node_id);
    node.name = item.name;
    node.type = item.device_type;
    node.status = item.status;
    node.version = item.software_version;
    node.streamAt = now;
    const connected = CONNECTED.has(item.status);
    node.uptime = connected ? item.uptime_secs : null;
    const flows = connected ? flowSummary(item.stats) : null;
    node.flows = flows;
    node.bitrate = flows ? flows.bitrate : null;
    if (connected) node.seen = seenAt;
    nodes.set(item.node_id, node);
  }

  /* ---------------------------------------------------------------- REST */
  let refreshing = false;
  let again = false;
  let lastRefresh = 0;
  let refreshTimer = null;

  async function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    lastRefresh = Date.now();
    try {
      const answer = await api("GET", "/api/v1/nodes");
      const box = $("fleet-error");
      if (!answer.ok || !Array.isArray(answer.data)) {
        box.textContent = "Could not read the node list: " + (answer.error || "unexpected answer");
        box.hidden = false;
        return;
      }
      box.hidden = true;
      const now = Date.now();
      const listed = new Set();
      for (const row of answer.data) { listed.add(row.id); mergeRest(row, now); }
      for (const id of [...nodes.keys()]) if (!listed.has(id)) forget(id);
      loaded = true;
      render();
    } finally {
      refreshing = false;
      if (again) { again = false; refreshSoon(); }
    }
  }

  /* A REST read soon, but not more often than every REFRESH_GAP_MS. */
  function refreshSoon() {
    if (refreshTimer !== null) return;
    const wait = Math.max(0, lastRefresh + REFRESH_GAP_MS - Date.now());
    refreshTimer = setTimeout(() => { refreshTimer = null; refresh(); }, wait);
  }

  function forget(id) {
    nodes.delete(id);
    const row = rows.get(id);
    if (row) { row.tr.remove(); rows.delete(id); }
  }

  /* ---------------------------------------------------------------- the stream */
  function onUpdate(payload, timestamp) {
    const started = performance.now();
    const now = Date.now();
    const seenAt = Date.parse(timestamp) || now;
    const items = (payload && Array.isArray(payload.nodes)) ? payload.nodes : [];
    let changedSet = items.length !== nodes.size;
    for (const item of items) {
      if (!item || !item.node_id) continue;
      if (!nodes.has(item.node_id)) changedSet = true;
      mergeStream(item, seenAt, now);
    }
    if (changedSet && loaded) refreshSoon(); // a node added or deleted elsewhere: read the list
    render();
    const done = performance.now();
    const marks = window.__mpFleetUpdates, costs = window.__mpFleetApplyMs, sent = window.__mpFleetSentAt;
    marks.push(done);
    costs.push(done - started);
    sent.push(seenAt);
    if (marks.length > HISTORY) { marks.shift(); costs.shift(); sent.shift(); }
  }

  /* ---------------------------------------------------------------- view */
  function matches(node, text, status, type) {
    if (type && node.type !== type) return false;
    if (status === "attention" ? !ATTENTION.has(node.status) : status && node.status !== status) return false;
    if (text && !node.name.toLowerCase().includes(text) && !node.id.toLowerCase().includes(text)) return false;
    return true;
  }

  function sortValue(node) {
    switch (sortKey) {
      case "type": return node.type;
      case "status": return STATUS_RANK[node.status] ?? 9;
      case "version": return node.version;
      case "uptime": return node.uptime;
      case "flows": {
        const f = node.flows;
        return f ? f.Critical * 1e9 + f.Error * 1e6 + f.Warning * 1e3 + f.total : null;
      }
      case "bitrate": return node.bitrate;
      case "seen": return node.seen;
      default: return node.name.toLowerCase();
    }
  }

  function compare(a, b) {
    const va = a.key, vb = b.key;
    if (va !== vb) {
      if (va === null || va === undefined) return 1; // unknown values last, either direction
      if (vb === null || vb === undefined) return -1;
      if (va < vb) return -sortDir;
      if (va > vb) return sortDir;
    }
    return a.name < b.name ? -1 : a.name > b.name ? 1 : a.node.id < b.node.id ? -1 : 1;
  }

  function view() {
    const text = search.value.trim().toLowerCase();
    const status = statusFilter.value, type = typeFilter.value;
    const list = [];
    for (const node of nodes.values()) {
      if (matches(node, text, status, type)) list.push({ node, key: sortValue(node), name: node.name.toLowerCase() });
    }
    list.sort(compare);
    return list.map((entry) => entry.node);
  }

  /* ---------------------------------------------------------------- rows */
  function ago(ms) {
    if (!ms) return "never";
    const secs = Math.round((Date.now() - ms) / 1000);
    if (secs < 5) return "now";
    if (secs < 60) return `${secs} s ago`;
    if (secs < 3600) return `${Math.floor(secs / 60)} min ago`;
    if (secs < 86400) return `${Math.floor(secs / 3600)} h ago`;
    return STAMP.format(ms);
  }

  function makeRow(id) {
    const link = el("a", { href: "/nodes/" + encodeURIComponent(id), class: "node-link" });
    const cells = {
      link,
      id: el("span", { class: "node-id mono muted", title: id }, id.slice(0, 8)),
      type: el("td", { class: "type" }),
      badge: el("span", { class: "badge" }),
      version: el("td", { class: "mono small" }),
      uptime: el("td", { class: "num" }),
      flows: el("td", { class: "flows" }),
      bitrate: el("td", { class: "num" }),
      seen: el("td", { class: "seen" }),
    };
    const tr = el("tr", { dataset: { nodeId: id } },
      el("th", { scope: "row", class: "name" }, link, cells.id),
      cells.type,
      el("td", {}, cells.badge),
      cells.version, cells.uptime, cells.flows, cells.bitrate, cells.seen);
    if (CAN_ADMIN) {
      tr.append(el("td", { class: "actions" },
        el("button", { type: "button", class: "btn btn-small btn-danger", onclick: () => askDelete(id) }, "Delete")));
    }
    const row = { tr, cells, last: {} };
    rows.set(id, row);
    return row;
  }

  function put(row, key, target, text) {
    if (row.last[key] === text) return;
    row.last[key] = text;
    target.textContent = text;
  }

  function flowChildren(flows) {
    if (!flows) return [el("span", { class: "muted" }, "–")];
    if (!flows.total) return [el("span", { class: "muted" }, "no flows")];
    const parts = [el("span", { class: "run", title: "running / configured" }, `${flows.running}/${flows.total}`)];
    for (const health of HEALTHS) {
      if (flows[health]) {
        parts.push(el("span", { class: "chip health-" + health, title: `${flows[health]} ${health}` },
          `${flows[health]} ${HEALTH_LABEL[health]}`));
      }
    }
    return parts;
  }

  function updateRow(node) {
    const row = rows.get(node.id) || makeRow(node.id);
    const c = row.cells;
    put(row, "name", c.link, node.name);
    put(row, "type", c.type, node.type);
    if (row.last.status !== node.status) {
      row.last.status = node.status;
      c.badge.className = "badge state-" + node.status;
      c.badge.textContent = node.status;
      row.tr.dataset.status = node.status;
    }
    put(row, "version", c.version, node.version || "–");
    put(row, "uptime", c.uptime, node.uptime === null || node.uptime === undefined ? "–" : fmt.duration(node.uptime));
    const flows = node.flows;
    const flowKey = flows ? HEALTHS.map((h) => flows[h]).join(",") + `|${flows.running}/${flows.total}` : "-";
    if (row.last.flows !== flowKey) {
      row.last.flows = flowKey;
      c.flows.replaceChildren(...flowChildren(flows));
    }
    put(row, "bitrate", c.bitrate, node.bitrate === null ? "–" : fmt.bitrate(node.bitrate));
    put(row, "seen", c.seen, ago(node.seen));
    if (row.last.seenAt !== node.seen) {
      row.last.seenAt = node.seen;
      c.seen.title = node.seen ? STAMP.format(node.seen) : "";
    }
    return row.tr;
  }

  /* ---------------------------------------------------------------- summary */
  const summary = { nodes: {}, flows: {} };

  function buildSummary() {
    const nodeBox = $("sum-nodes");
    for (const status of STATUSES) {
      const value = el("span", { class: "sum-value", id: "sum-" + status }, "0");
      const button = el("button", {
        type: "button", class: "sum-item state-" + status, "aria-pressed": "false",
        title: `Show ${status} nodes only`,
        onclick: () => { statusFilter.value = statusFilter.value === status ? "" : status; filtersChanged(); },
      }, value, el("span", { class: "sum-label" }, status));
      summary.nodes[status] = { value, button };
      nodeBox.append(button);
    }
    const flowBox = $("sum-flows");
    const running = el("span", { class: "sum-value", id: "sum-flows-running" }, "0");
    flowBox.append(el("div", { class: "sum-item sum-static" }, running, el("span", { class: "sum-label" }, "running")));
    summary.flows.running = running;
    for (const health of HEALTHS) {
      const value = el("span", { class: "sum-value", id: "sum-" + health.toLowerCase() }, "0");
      flowBox.append(el("div", { class: "sum-item sum-static health-" + health }, value,
        el("span", { class: "sum-label" }, health)));
      summary.flows[health] = value;
    }
  }

  function renderSummary() {
    const counts = { online: 0, degraded: 0, error: 0, offline: 0, pending: 0 };
    const flows = { Healthy: 0, Warning: 0, Error: 0, Critical: 0, running: 0, total: 0 };
    for (const node of nodes.values()) {
      if (node.status in counts) counts[node.status] += 1;
      const f = node.flows;
      if (f) {
        for (const health of HEALTHS) flows[health] += f[health];
        flows.running += f.running;
        flows.total += f.total;
      }
    }
    for (const status of STATUSES) {
      const { value, button } = summary.nodes[status];
      const text = String(counts[status]);
      if (value.textContent !== text) value.textContent = text;
      button.classList.toggle("zero", !counts[status]);
      const pressed = String(statusFilter.value === status);
      if (button.getAttribute("aria-pressed") !== pressed) button.setAttribute("aria-pressed", pressed);
    }
    const running = `${flows.running}/${flows.total}`;
    if (summary.flows.running.textContent !== running) summary.flows.running.textContent = running;
    for (const health of HEALTHS) {
      const value = summary.flows[health];
      const text = String(flows[health]);
      if (value.textContent !== text) value.textContent = text;
      value.parentElement.classList.toggle("zero", !flows[health]);
    }
    const total = nodes.size;
    const count = `${total} node${total === 1 ? "" : "s"}`;
    if ($("fleet-count").textContent !== count) $("fleet-count").textContent = count;
  }

  /* ---------------------------------------------------------------- render */
  function render() {
    renderSummary();
    if (!loaded && !nodes.size) return;
    const list = view();
    const pages = Math.max(1, Math.ceil(list.length / PER_PAGE));
    page = Math.min(page, pages - 1);
    const first = page * PER_PAGE;
    const slice = list.slice(first, first + PER_PAGE);
    const wanted = slice.map(updateRow);
    if (!wanted.length) {
      const filtered = nodes.size > 0;
      const text = filtered ? "No node matches the filters." : CAN_ADMIN ? "No nodes yet: add one with Add node." : "No nodes yet.";
      tbody.replaceChildren(el("tr", {}, el("td", { colspan: columns, class: "muted empty" }, text)));
      shown = [];
    } else if (wanted.length !== shown.length || wanted.some((tr, i) => tr !== shown[i])) {
      tbody.replaceChildren(...wanted);
      shown = wanted;
    }
    $("fleet-range").textContent = list.length
      ? `${first + 1}–${first + slice.length} of ${list.length}${list.length !== nodes.size ? ` (of ${nodes.size})` : ""}`
      : "";
    $("page-label").textContent = `Page ${page + 1} of ${pages}`;
    $("page-prev").disabled = page === 0;
    $("page-next").disabled = page >= pages - 1;
  }

  function filtersChanged() {
    page = 0;
    render();
  }

  /* ---------------------------------------------------------------- sorting */
  function paintSort() {
    for (const th of document.querySelectorAll("#fleet-table th[data-key]")) {
      if (th.dataset.key === sortKey) th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
  }

  for (const button of document.querySelectorAll("#fleet-table button.sort")) {
    button.addEventListener("click", () => {
      const key = button.dataset.key;
      if (key === sortKey) sortDir = -sortDir;
      else { sortKey = key; sortDir = NUMERIC.has(key) ? -1 : 1; }
      paintSort();
      render();
    });
  }

  /* ---------------------------------------------------------------- filters and keys */
  search.addEventListener("input", filtersChanged);
  statusFilter.addEventListener("change", filtersChanged);
  typeFilter.addEventListener("change", filtersChanged);
  $("fleet-filters").addEventListener("submit", (event) => event.preventDefault());
  $("fleet-filters").addEventListener("reset", () => setTimeout(filtersChanged, 0));
  search.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && search.value) { search.value = ""; filtersChanged(); }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) return;
    const target = event.target;
    if (target instanceof HTMLElement && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName))) return;
    if (document.querySelector("dialog[open]")) return;
    event.preventDefault();
    search.focus();
    search.select();
  });
  $("page-prev").addEventListener("click", () => { if (page > 0) { page -= 1; render(); } });
  $("page-next").addEventListener("click", () => { page += 1; render(); });

  /* ---------------------------------------------------------------- add and delete (admins) */
  function showError(box, text) {
    box.textContent = text || "";
    box.hidden = !text;
  }

  function setupAdmin() {
    const dialog = $("add-dialog");
    const form = $("add-form");
    const done = $("add-done");
    const name = $("add-name");
    const error = $("add-error");
    $("add-node-open").addEventListener("click", () => {
      form.reset();
      form.hidden = false;
      done.hidden = true;
      $("add-token").value = "";
      showError(error, "");
      dialog.showModal();
      name.focus();
    });
    $("add-cancel").addEventListener("click", () => dialog.close());
    $("add-close").addEventListener("click", () => dialog.close());
    dialog.addEventListener("close", () => { $("add-token").value = ""; $("add-node-open").focus(); });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const wanted = name.value.trim();
      if (!wanted || wanted.length > 128) {
        showError(error, "A name of 1–128 characters is needed.");
        name.focus();
        return;
      }
      const submit = $("add-submit");
      submit.disabled = true;
      try {
        const answer = await api("POST", "/api/v1/nodes", { name: wanted, device_type: $("add-type").value });
        if (!answer.ok || !answer.data || !answer.data.registration_token) {
          showError(error, "Could not create the node: " + (answer.error || "unexpected answer"));
          return;
        }
        mergeRest(answer.data, Date.now());
        render();
        $("add-done-name").textContent = answer.data.name;
        $("add-token").value = answer.data.registration_token;
        form.hidden = true;
        done.hidden = false;
        $("add-copy").focus();
        toast(`Node ${answer.data.name} created`, "ok");
      } finally {
        submit.disabled = false;
      }
    });
    $("add-copy").addEventListener("click", async () => {
      const input = $("add-token");
      try {
        await navigator.clipboard.writeText(input.value);
        toast("Token copied", "ok");
      } catch (_) {
        input.focus();
        input.select();
        let copied = false;
        try { copied = document.execCommand("copy"); } catch (_) { copied = false; }
        if (copied) toast("Token copied", "ok");
        else toast("Could not copy: the token is selected, press Ctrl+C", "error");
      }
    });

    const confirmBox = $("delete-dialog");
    $("delete-cancel").addEventListener("click", () => confirmBox.close());
    $("delete-confirm").addEventListener("click", async () => {
      if (!deleting) return;
      const { id, name: label } = deleting;
      const button = $("delete-confirm");
      button.disabled = true;
      try {
        const answer = await api("DELETE", "/api/v1/nodes/" + encodeURIComponent(id));
        if (!answer.ok && answer.status !== 404) {
          showError($("delete-error"), "Could not delete the node: " + answer.error);
          return;
        }
        forget(id);
        render();
        confirmBox.close();
        toast(`Node ${label} deleted`, "ok");
      } finally {
        button.disabled = false;
      }
    });
    confirmBox.addEventListener("close", () => { deleting = null; });
  }

  function askDelete(id) {
    const node = nodes.get(id);
    if (!node) return;
    deleting = { id, name: node.name };
    $("delete-name").textContent = node.name;
    showError($("delete-error"), "");
    $("delete-dialog").showModal();
    $("delete-cancel").focus();
  }

  /* ---------------------------------------------------------------- start */
  buildSummary();
  paintSort();
  if (CAN_ADMIN) setupAdmin();
  refresh();
  setInterval(refresh, REFRESH_MS);
  MP.dashboard(onUpdate);
})();
