/* The events page (/events): GET /api/v1/events with the filters of interop.md 7.3.
 *
 * - The filters live in the URL query (history.replaceState): a filtered view can be shared and
 *   survives a reload. `from`/`to` are kept there as RFC 3339 UTC; the inputs show local time.
 * - The answer is a bare array; X-Total-Count gives the total (the "N events" line and the pager).
 * - Operators and above: a checkbox per unacknowledged row, "select all on page", "Acknowledge
 *   selected" (one POST /api/v1/events/<id>/ack each) and a per-row Ack button; after an ack the
 *   list and the header's unacknowledged badge (MP.refreshUnacked) are refreshed.
 * - Auto-refresh every 10 s while on page 1 with nothing selected and no focus in the table.
 */
"use strict";

(function () {
  const el = MP.el;
  const PER_PAGE = 50; // the API's default; ?per_page=1..200 in the URL overrides it
  const REFRESH_MS = 10000;
  const ACK_PARALLEL = 4;
  const FILTERS = ["node_id", "severity", "category", "flow_id", "search", "from", "to"];
  const canAck = MP.can("operator") && !!document.getElementById("ev-ack-selected");

  const $ = (id) => document.getElementById(id);
  const form = $("ev-filters");
  const inputs = {
    node_id: $("f-node"), severity: $("f-severity"), category: $("f-category"), flow_id: $("f-flow"),
    search: $("f-search"), from: $("f-from"), to: $("f-to"),
  };
  const rowsBody = $("ev-rows");
  const totalText = $("ev-total");
  const pageText = $("ev-page");
  const prev = $("ev-prev");
  const next = $("ev-next");
  const errorBox = $("ev-error");
  const auto = $("ev-auto");
  const ackSelected = $("ev-ack-selected");
  const selectedText = $("ev-selected");
  const progress = $("ev-ack-progress");
  const selectAll = $("ev-select-all");
  const columns = document.querySelectorAll("#ev-table thead th").length;

  const state = { filters: {}, page: 1, perPage: PER_PAGE, total: 0, rows: [], selected: new Set(), busy: false };
  const nodeNames = new Map();
  let loadSeq = 0;

  /* ------------------------------------------------------------------ time conversion */
  const pad = (n) => String(n).padStart(2, "0");

  /* A datetime-local value (local wall time) → RFC 3339 UTC; `end` makes the minute inclusive. */
  function localToUtc(value, end) {
    if (!value) return "";
    const when = new Date(value);
    if (isNaN(when)) return "";
    if (end && when.getSeconds() === 0) when.setSeconds(59, 999);
    return when.toISOString();
  }

  /* RFC 3339 → a datetime-local value in this browser's time zone. */
  function utcToLocal(iso) {
    if (!iso) return "";
    const when = new Date(iso);
    if (isNaN(when)) return "";
    return `${when.getFullYear()}-${pad(when.getMonth() + 1)}-${pad(when.getDate())}T${pad(when.getHours())}:${pad(when.getMinutes())}`;
  }

  /* ------------------------------------------------------------------ URL <-> filters */
  function readUrl() {
    const query = new URLSearchParams(location.search);
    const filters = {};
    for (const key of FILTERS) {
      const value = (query.get(key) || "").trim();
      if (value) filters[key] = value;
    }
    const page = parseInt(query.get("page") || "1", 10);
    state.filters = filters;
    state.page = Number.isFinite(page) && page >= 1 ? page : 1;
    const perPage = parseInt(query.get("per_page") || "", 10);
    state.perPage = Number.isFinite(perPage) && perPage >= 1 && perPage <= 200 ? perPage : PER_PAGE;
  }

  function writeUrl() {
    const query = new URLSearchParams();
    for (const key of FILTERS) if (state.filters[key]) query.set(key, state.filters[key]);
    if (state.page > 1) query.set("page", String(state.page));
    if (state.perPage !== PER_PAGE) query.set("per_page", String(state.perPage));
    const search = query.toString();
    const target = location.pathname + (search ? "?" + search : "");
    if (target !== location.pathname + location.search) history.replaceState(null, "", target);
  }

  function filtersToInputs() {
    for (const key of FILTERS) {
      const value = state.filters[key] || "";
      if (key === "from" || key === "to") inputs[key].value = utcToLocal(value);
      else {
        if (key === "node_id") ensureNodeOption(value);
        inputs[key].value = value;
      }
    }
  }

  function inputsToFilters() {
    const filters = {};
    for (const key of FILTERS) {
      let value = inputs[key].value.trim();
      if (key === "from") value = localToUtc(value, false);
      if (key === "to") value = localToUtc(value, true);
      if (value) filters[key] = value;
    }
    return filters;
  }

  /* ------------------------------------------------------------------ nodes */
  function ensureNodeOption(id) {
    if (!id || [...inputs.node_id.options].some((o) => o.value === id)) return;
    inputs.node_id.append(el("option", { value: id }, nodeNames.get(id) || id));
  }

  async function loadNodes() {
    const answer = await MP.api("GET", "/api/v1/nodes");
    if (!answer.ok || !Array.isArray(answer.data)) {
      MP.toast("Nodes could not be listed: " + answer.error, "error");
      return;
    }
    const nodes = answer.data.slice().sort((a, b) => a.name.localeCompare(b.name));
    for (const node of nodes) nodeNames.set(node.id, node.name);
    const chosen = state.filters.node_id || "";
    inputs.node_id.replaceChildren(
      el("option", { value: "" }, "All nodes"),
      ...nodes.map((node) => el("option", { value: node.id }, `${node.name} (${node.device_type})`)),
    );
    ensureNodeOption(chosen);
    inputs.node_id.value = chosen;
    render();
  }

  /* ------------------------------------------------------------------ loading */
  function showError(text) {
    errorBox.textContent = text || "";
    errorBox.hidden = !text;
  }

  async function load() {
    const seq = ++loadSeq;
    const query = new URLSearchParams();
    for (const key of FILTERS) if (state.filters[key]) query.set(key, state.filters[key]);
    query.set("page", String(state.page));
    query.set("per_page", String(state.perPage));
    const answer = await MP.api("GET", "/api/v1/events?" + query.toString());
    if (seq !== loadSeq) return; // a newer request is under way
    if (!answer.ok || !Array.isArray(answer.data)) {
      showError("Events could not be listed: " + (answer.error || "unexpected answer"));
      return;
    }
    showError("");
    const total = parseInt(answer.headers.get("X-Total-Count") || "", 10);
    state.total = Number.isFinite(total) ? total : answer.data.length;
    const pages = Math.max(1, Math.ceil(state.total / state.perPage));
    if (state.page > pages && state.total > 0) {
      state.page = pages; // the list shrank under us: show its last page
      writeUrl();
      return load();
    }
    state.rows = answer.data;
    const present = new Set(state.rows.filter((e) => !e.acknowledged).map((e) => e.id));
    for (const id of [...state.selected]) if (!present.has(id)) state.selected.delete(id);
    render();
  }

  /* ------------------------------------------------------------------ rendering */
  function nodeCell(event) {
    if (!event.node_id) return el("td", { class: "muted ev-node" }, "manager");
    const name = nodeNames.get(event.node_id);
    return el("td", { class: "ev-node" }, el("a", { href: "/nodes/" + encodeURIComponent(event.node_id), title: event.node_id }, name || event.node_id.slice(0, 8) + "…"));
  }

  function messageCell(event) {
    const cell = el("td", { class: "ev-message" }, el("span", {}, event.message));
    const details = event.details;
    if (details !== null && details !== undefined && !(typeof details === "object" && Object.keys(details).length === 0)) {
      cell.append(el("details", { class: "ev-details" },
        el("summary", {}, "details"),
        el("pre", {}, typeof details === "string" ? details : JSON.stringify(details, null, 2))));
    }
    return cell;
  }

  function ackCell(event) {
    if (!event.acknowledged) return el("td", { class: "muted" }, "–");
    return el("td", { class: "ev-acked" }, el("span", { class: "ev-tick", "aria-hidden": "true" }, "✓ "),
      event.acknowledged_by ? "by " + event.acknowledged_by : "yes");
  }

  function row(event) {
    const cells = [];
    if (canAck) {
      const box = event.acknowledged ? null : el("input", {
        type: "checkbox", class: "ev-pick", checked: state.selected.has(event.id),
        "aria-label": `Select event ${event.id}: ${event.message}`,
        onchange: (e) => { if (e.target.checked) state.selected.add(event.id); else state.selected.delete(event.id); updateSelection(); },
      });
      cells.push(el("td", { class: "ev-check" }, box));
    }
    cells.push(
      el("td", { class: "ev-time", title: event.created_at }, MP.fmt.time(event.created_at)),
      el("td", {}, el("span", { class: `badge sev-${event.severity}` }, event.severity)),
      nodeCell(event),
      el("td", {}, event.category),
      el("td", { class: "mono" }, event.flow_id || ""),
      messageCell(event),
      ackCell(event),
    );
    if (canAck) {
      cells.push(el("td", { class: "ev-actions-cell" }, event.acknowledged ? null : el("button", {
        type: "button", class: "btn btn-small ev-ack", "aria-label": `Acknowledge event ${event.id}`,
        onclick: (e) => acknowledge([event.id], e.currentTarget),
      }, "Ack")));
    }
    return el("tr", { class: `ev-row ev-${event.severity}${event.acknowledged ? " ev-is-acked" : ""}`, dataset: { id: String(event.id) } }, cells);
  }

  function render() {
    const pages = Math.max(1, Math.ceil(state.total / state.perPage));
    totalText.textContent = `${MP.fmt.count(state.total)} event${state.total === 1 ? "" : "s"}`;
    pageText.textContent = `Page ${state.page} of ${pages}`;
    prev.disabled = state.page <= 1;
    next.disabled = state.page >= pages;
    if (!state.rows.length) {
      const filtered = FILTERS.some((key) => state.filters[key]);
      rowsBody.replaceChildren(el("tr", {}, el("td", { colspan: columns, class: "muted ev-empty" },
        filtered ? "No events match these filters." : "No events yet.")));
    } else {
      rowsBody.replaceChildren(...state.rows.map(row));
    }
    updateSelection();
  }

  function updateSelection() {
    if (!canAck) return;
    const open = state.rows.filter((e) => !e.acknowledged);
    const picked = open.filter((e) => state.selected.has(e.id)).length;
    selectedText.textContent = `${picked} selected`;
    ackSelected.disabled = picked === 0 || state.busy;
    selectAll.disabled = open.length === 0 || state.busy;
    selectAll.checked = open.length > 0 && picked === open.length;
    selectAll.indeterminate = picked > 0 && picked < open.length;
  }

  /* ------------------------------------------------------------------ acknowledging */
  async function acknowledge(ids, button) {
    if (state.busy || !ids.length) return;
    state.busy = true;
    // A row's own button: after the refresh the keyboard goes on at the same place in the list.
    const place = button && document.activeElement === button ? [...rowsBody.children].indexOf(button.closest("tr")) : -1;
    if (button) button.disabled = true;
    progress.className = "";
    updateSelection();
    let done = 0;
    const failures = [];
    const queue = ids.slice();
    const report = () => { progress.textContent = `Acknowledging… ${done + failures.length} of ${ids.length}`; };
    report();
    async function worker() {
      while (queue.length) {
        const id = queue.shift();
        const answer = await MP.api("POST", `/api/v1/events/${encodeURIComponent(id)}/ack`);
        if (answer.ok) { done++; state.selected.delete(id); } else failures.push(`#${id}: ${answer.error}`);
        report();
      }
    }
    await Promise.all(Array.from({ length: Math.min(ACK_PARALLEL, ids.length) }, worker));
    state.busy = false;
    const summary = `Acknowledged ${done} of ${ids.length}` + (failures.length ? `; ${failures.length} failed` : "");
    progress.textContent = summary + (failures.length ? ": " + failures.slice(0, 3).join("; ") + (failures.length > 3 ? " …" : "") : "");
    progress.className = failures.length ? "form-error" : "form-ok";
    if (failures.length) MP.toast(summary + ": " + failures[0], "error");
    else MP.toast(summary, "ok");
    await load();
    MP.refreshUnacked();
    if (place >= 0) refocus(place);
  }

  function refocus(index) {
    const list = [...rowsBody.children];
    for (const tr of list.slice(index).concat(list.slice(0, index).reverse())) {
      const target = tr.querySelector("button.ev-ack");
      if (target) { target.focus(); return; }
    }
    $("ev-table").focus();
  }

  /* ------------------------------------------------------------------ wiring */
  function apply() {
    state.filters = inputsToFilters();
    state.page = 1;
    state.selected.clear();
    writeUrl();
    load();
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); apply(); });
  for (const key of ["node_id", "severity", "from", "to"]) inputs[key].addEventListener("change", apply);
  $("f-clear").addEventListener("click", () => {
    for (const key of FILTERS) inputs[key].value = "";
    apply();
  });
  $("ev-reload").addEventListener("click", () => load());
  prev.addEventListener("click", () => { if (state.page > 1) { state.page--; state.selected.clear(); writeUrl(); load(); } });
  next.addEventListener("click", () => { state.page++; state.selected.clear(); writeUrl(); load(); });
  if (canAck) {
    selectAll.addEventListener("change", () => {
      for (const event of state.rows) {
        if (event.acknowledged) continue;
        if (selectAll.checked) state.selected.add(event.id); else state.selected.delete(event.id);
      }
      for (const box of rowsBody.querySelectorAll("input.ev-pick")) box.checked = selectAll.checked;
      updateSelection();
    });
    ackSelected.addEventListener("click", () => acknowledge(state.rows.filter((e) => state.selected.has(e.id)).map((e) => e.id)));
  }

  setInterval(() => {
    if (!auto.checked || state.busy || document.hidden || state.page !== 1 || state.selected.size) return;
    if (document.activeElement && rowsBody.contains(document.activeElement)) return; // keep the keyboard's place
    if (rowsBody.querySelector("details[open]")) return; // someone is reading a row's details
    load();
  }, REFRESH_MS);

  readUrl();
  filtersToInputs();
  writeUrl();
  load();
  loadNodes();
})();
