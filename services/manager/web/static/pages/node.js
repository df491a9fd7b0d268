/* The node detail page (/nodes/<id>): the node's header, its flows (state, health, bit rates,
 * TR 101 290, media, outputs, SRT legs, a bit-rate chart of the last 10 minutes), its tunnels and
 * its recent events, live from /ws/dashboard. Operators also get flow commands, add/remove output
 * and a JSON config editor (validate → diff → send). Everything goes through /api/v1.
 */
"use strict";

(function () {
  const { api, el, fmt } = MP;
  const nodeId = document.body.dataset.nodeId;
  const base = `/api/v1/nodes/${encodeURIComponent(nodeId)}`;
  const canOperate = MP.can("operator");
  const WINDOW_S = 600; // the chart keeps the last 10 minutes
  const EVENTS_EVERY_MS = 10000;
  const NODE_EVERY_MS = 15000;
  const $ = (id) => document.getElementById(id);

  const TR_LABELS = {
    sync_loss_count: ["TS sync loss", 1], sync_byte_errors: ["Sync byte", 1], cc_errors: ["Continuity count", 1],
    pat_errors: ["PAT", 1], pmt_errors: ["PMT", 1], pid_errors: ["PID", 1],
    tei_errors: ["Transport error", 2], pcr_discontinuity_errors: ["PCR discontinuity", 2],
    pcr_accuracy_errors: ["PCR accuracy", 2], crc_errors: ["CRC", 2], pcr_repetition_errors: ["PCR repetition", 2],
    pts_errors: ["PTS", 2], cat_errors: ["CAT", 2], section_errors: ["Section", 3], truncated_packets: ["Truncated packets", 3],
  };

  let node = null; // the REST record
  let live = null; // this node's entry of the last dashboard_update
  let deviceType = null;
  const views = new Map(); // flow_id -> the flow card's parts
  const series = new Map(); // flow_id -> {t, input, output} (kept across cards, trimmed to WINDOW_S)

  // ------------------------------------------------------------------ small helpers
  function badge(text, cls) { return el("span", { class: "badge " + cls }, text); }
  function kv(pairs) {
    return el("dl", { class: "kv" }, pairs.filter(Boolean).map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v))));
  }
  function setBadge(node, text, cls) { node.textContent = text; node.className = "badge " + cls; }
  function shortBps(v) {
    if (v >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e3) return (v / 1e3).toFixed(0) + "k";
    return String(Math.round(v));
  }
  function addrPort(addr, port) { return (addr.includes(":") ? `[${addr}]` : addr) + ":" + port; }
  function errorText(answer) {
    if (answer.status === 0) return answer.error;
    return `${answer.status}: ${answer.error || "request failed"}`;
  }

  /* A yes/no question in the page's <dialog>; resolves true for yes. */
  function confirmDialog(text, yesLabel) {
    const dialog = $("confirm-dialog");
    $("confirm-text").textContent = text;
    $("confirm-yes").textContent = yesLabel;
    dialog.returnValue = "";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
      dialog.showModal();
    });
  }

  // ------------------------------------------------------------------ header
  function renderHead() {
    const name = (live && live.name) || (node && node.name) || nodeId;
    const status = (live && live.status) || (node && node.status) || "unknown";
    $("node-name").textContent = name;
    $("crumb-name").textContent = name;
    document.title = `${name} · Mediaplane manager`;
    setBadge($("node-status"), status, "dot state-" + status);
    $("node-status").title = "Node status: " + status;
    $("node-type").textContent = deviceType === "relay" ? "Relay" : deviceType === "edge" ? "Edge node" : "";
    const desc = node && node.description;
    $("node-desc").hidden = !desc;
    $("node-desc").textContent = desc || "";
    $("fact-version").textContent = (live && live.software_version) || (node && node.software_version) || "–";
    const seen = live && live.status !== "offline" && live.status !== "pending" && live.seenAt ? live.seenAt : node && node.last_seen_at;
    $("fact-seen").textContent = seen ? fmt.time(seen) : "never";
    const uptime = live ? live.uptime_secs : null;
    $("fact-uptime").textContent = uptime === null || uptime === undefined ? "–" : fmt.duration(uptime);
    const s = live && live.stats;
    const h = live && live.health;
    const src = s && s.total_flows !== undefined ? s : h;
    $("fact-flows").textContent = src && src.total_flows !== undefined ? `${src.active_flows ?? 0}/${src.total_flows} running` : "–";
    $("fact-flows").parentElement.hidden = deviceType === "relay";
  }

  function showSections() {
    const edge = deviceType === "edge";
    $("flows-section").hidden = !edge;
    $("tunnels-section").hidden = !edge;
    $("relay-section").hidden = deviceType !== "relay";
    if ($("config-section")) $("config-section").hidden = !edge;
  }

  async function loadNode(first) {
    const answer = await api("GET", base);
    if (!answer.ok) {
      $("node-error").hidden = false;
      $("node-error").textContent = answer.status === 404 || answer.status === 403
        ? "This node does not exist or you may not see it."
        : "The node could not be read: " + errorText(answer);
      return false;
    }
    $("node-error").hidden = true;
    node = answer.data;
    const changed = deviceType !== node.device_type;
    deviceType = node.device_type;
    renderHead();
    if (changed) showSections();
    if (first && deviceType === "edge") {
      loadHistory();
      if (canOperate) loadConfig();
    }
    return true;
  }

  // ------------------------------------------------------------------ the live stream
  function onUpdate(payload, timestamp) {
    const found = (payload.nodes || []).find((n) => n.node_id === nodeId);
    if (!found) return;
    const parsed = Date.parse(timestamp);
    const t = (isNaN(parsed) ? Date.now() : parsed) / 1000;
    live = { ...found, seenAt: found.stats || found.health ? new Date(t * 1000).toISOString() : null };
    if (!deviceType) { deviceType = found.device_type; showSections(); }
    renderHead();
    if (deviceType === "edge") {
      renderFlows(found.stats, t);
      renderTunnels(found.stats);
    } else if (deviceType === "relay") {
      renderRelay(found.stats, found.health);
    }
  }

  // ------------------------------------------------------------------ flows
  function renderFlows(stats, t) {
    const flows = stats && Array.isArray(stats.flows) ? stats.flows : null;
    const box = $("flows");
    const empty = $("flows-empty");
    if (!flows) {
      empty.textContent = live && live.status === "offline" ? "The node is offline: no live statistics." : "No live statistics from this node yet.";
      empty.hidden = false;
      box.hidden = true;
      return;
    }
    box.hidden = false;
    empty.hidden = flows.length > 0;
    empty.textContent = "This node has no flows.";
    const seen = new Set();
    flows.forEach((flow, index) => {
      seen.add(flow.flow_id);
      let view = views.get(flow.flow_id);
      if (!view) {
        view = buildFlowCard(flow);
        views.set(flow.flow_id, view);
      }
      if (box.children[index] !== view.card) box.insertBefore(view.card, box.children[index] || null);
      updateFlowCard(view, flow);
      record(flow.flow_id, t, flow.input ? flow.input.bitrate_bps : 0,
        (flow.outputs || []).reduce((sum, o) => sum + (o.bitrate_bps || 0), 0));
      drawChart(view);
    });
    for (const [id, view] of views) {
      if (seen.has(id)) continue;
      if (view.chart) view.chart.destroy();
      if (view.resize) view.resize.disconnect();
      view.card.remove();
      views.delete(id);
    }
  }

  function buildFlowCard(flow) {
    const id = flow.flow_id;
    const v = { id };
    v.name = el("span", {}, flow.flow_name);
    v.state = el("span", { class: "badge" });
    v.health = el("span", { class: "badge" });
    v.uptime = el("span", { class: "muted" });
    v.result = el("p", { class: "cmd-result", role: "status", "aria-live": "polite" });
    const head = el("header", { class: "flow-head" },
      el("h3", {}, v.name, " ", el("span", { class: "muted mono flow-id" }, id)), v.state, v.health, v.uptime,
      el("span", { class: "spacer" }));
    if (canOperate) {
      v.buttons = {};
      for (const [type, label, cls] of [["start_flow", "Start", ""], ["stop_flow", "Stop", ""], ["restart_flow", "Restart", ""]]) {
        const button = el("button", { type: "button", class: "btn btn-small " + cls, dataset: { action: type }, "aria-label": `${label} flow ${id}` }, label);
        button.addEventListener("click", () => flowCommand(v, { type, flow_id: id }, label));
        v.buttons[type] = button;
        head.append(button);
      }
    }
    v.metrics = el("div", { class: "flow-metrics" });
    v.chartBox = el("div", { class: "flow-chart", role: "img", "aria-label": `Bit rate of flow ${id} over the last 10 minutes` });
    v.outputsBody = el("tbody");
    v.outputRows = new Map();
    const outputsHead = el("tr", {}, el("th", { scope: "col" }, "Output"), el("th", { scope: "col" }, "Id"),
      el("th", { scope: "col" }, "Type"), el("th", { scope: "col" }, "State"), el("th", { scope: "col", class: "num" }, "Bit rate"),
      el("th", { scope: "col", class: "num" }, "Sent"), el("th", { scope: "col", class: "num" }, "Dropped"),
      canOperate ? el("th", { scope: "col" }, el("span", { class: "visually-hidden" }, "Actions")) : null);
    v.srt = el("div", { class: "srt" });
    v.card = el("article", { class: "card flow", id: "flow-" + id, dataset: { flowId: id }, "aria-label": `Flow ${flow.flow_name}` },
      head, v.result,
      el("div", { class: "flow-body" }, v.metrics, v.chartBox),
      el("h4", {}, "Outputs"),
      el("div", { class: "table-wrap" }, el("table", { class: "outputs" }, el("thead", {}, outputsHead), v.outputsBody)),
      v.srt,
      canOperate ? addOutputForm(v) : null);
    return v;
  }

  function updateFlowCard(v, flow) {
    v.name.textContent = flow.flow_name;
    v.card.setAttribute("aria-label", `Flow ${flow.flow_name}`);
    setBadge(v.state, flow.state, "dot state-" + flow.state);
    v.state.title = "Flow state";
    setBadge(v.health, flow.health, "health-" + flow.health);
    v.health.title = "Flow health";
    v.uptime.textContent = flow.state === "Running" ? "up " + fmt.duration(flow.uptime_secs) : "";
    if (v.buttons && !v.pending) {
      v.buttons.start_flow.disabled = flow.state === "Running" || flow.state === "Starting";
      v.buttons.stop_flow.disabled = flow.state === "Stopped" || flow.state === "Idle";
    }
    v.metrics.replaceChildren(...flowMetrics(flow));
    updateOutputs(v, flow);
    v.srt.replaceChildren(...srtLegs(flow));
  }

  function flowMetrics(flow) {
    const input = flow.input || {};
    const outBps = (flow.outputs || []).reduce((sum, o) => sum + (o.bitrate_bps || 0), 0);
    const blocks = [];
    blocks.push(el("div", { class: "metric-block" }, el("h4", {}, "Input"), kv([
      ["Type", input.input_type || "–"],
      ["State", input.state || "–"],
      ["Bit rate", el("strong", { class: "input-bitrate" }, fmt.bitrate(input.bitrate_bps))],
      ["Output total", fmt.bitrate(outBps)],
      ["Received", fmt.count(input.packets_received) + " pkts"],
      ["Lost", fmt.count(input.packets_lost)],
      input.packets_recovered_fec ? ["FEC recovered", fmt.count(input.packets_recovered_fec)] : null,
      input.redundancy_switches ? ["2022-7 switches", fmt.count(input.redundancy_switches)] : null,
      input.peer_addr ? ["Peer", input.peer_addr] : null,
      flow.iat ? ["IAT", `${flow.iat.min_us.toFixed(0)}/${flow.iat.avg_us.toFixed(0)}/${flow.iat.max_us.toFixed(0)} µs`] : null,
      flow.pdv_jitter_us !== null && flow.pdv_jitter_us !== undefined ? ["PDV jitter", flow.pdv_jitter_us.toFixed(0) + " µs"] : null,
    ])));
    blocks.push(el("div", { class: "metric-block tr101290" }, el("h4", {}, "TR 101 290"), tr101290(flow.tr101290)));
    blocks.push(el("div", { class: "metric-block media" }, el("h4", {}, "Media"), media(flow.media_analysis)));
    return blocks;
  }

  function tr101290(tr) {
    if (!tr) return el("p", { class: "muted" }, "Not analysed (flow not running).");
    const flags = el("div", { class: "row tr-flags" },
      badge(tr.priority1_ok ? "P1 OK" : "P1 alarm", tr.priority1_ok ? "health-Healthy" : "health-Critical"),
      badge(tr.priority2_ok ? "P2 OK" : "P2 alarm", tr.priority2_ok ? "health-Healthy" : "health-Warning"));
    const errors = Object.entries(TR_LABELS).filter(([key]) => tr[key] > 0);
    const list = errors.length
      ? el("ul", { class: "tr-errors" }, errors.map(([key, [label, prio]]) =>
        el("li", { class: prio === 1 ? "sev-critical" : "sev-warning" }, `${label}: ${fmt.count(tr[key])}`, prio < 3 ? el("span", { class: "muted" }, ` (P${prio})`) : null)))
      : el("p", { class: "muted tr-clean" }, "No errors counted.");
    return el("div", {}, flags, list, el("p", { class: "muted small" }, `${fmt.count(tr.ts_packets_analyzed)} TS packets analysed`));
  }

  function media(m) {
    if (!m) return el("p", { class: "muted" }, "No media analysis.");
    const rows = [];
    for (const v of m.video_streams || []) {
      const parts = [v.codec.toUpperCase()];
      if (v.resolution) parts.push(v.resolution);
      if (v.frame_rate) parts.push(`${Number(v.frame_rate.toFixed(2))} fps`);
      if (v.profile) parts.push(v.profile + (v.level ? " " + v.level : ""));
      rows.push(el("li", { class: "media-video" }, el("span", { class: "tag" }, "Video"), " ", parts.join(" · "), el("span", { class: "muted" }, ` PID ${v.pid}`)));
    }
    for (const a of m.audio_streams || []) {
      const parts = [a.codec.toUpperCase()];
      if (a.sample_rate_hz) parts.push(`${(a.sample_rate_hz / 1000).toFixed(1)} kHz`);
      if (a.channels) parts.push(`${a.channels} ch`);
      if (a.language) parts.push(a.language);
      rows.push(el("li", { class: "media-audio" }, el("span", { class: "tag" }, "Audio"), " ", parts.join(" · "), el("span", { class: "muted" }, ` PID ${a.pid}`)));
    }
    if (!rows.length) rows.push(el("li", { class: "muted" }, "No elementary streams found yet."));
    return el("div", {}, el("ul", { class: "media-list" }, rows),
      el("p", { class: "muted small" }, `${m.program_count} program(s) · ${fmt.bitrate(m.total_bitrate_bps)} · ${m.payload_format || ""}`));
  }

  function updateOutputs(v, flow) {
    const outputs = flow.outputs || [];
    const seen = new Set();
    outputs.forEach((o, index) => {
      seen.add(o.output_id);
      let row = v.outputRows.get(o.output_id);
      if (!row) {
        row = { tr: el("tr", { dataset: { outputId: o.output_id } }), cells: [] };
        for (let i = 0; i < 7; i++) row.cells.push(el("td", { class: i >= 4 ? "num" : i === 1 ? "mono" : "" }));
        row.tr.append(...row.cells);
        if (canOperate) {
          const remove = el("button", { type: "button", class: "btn btn-small btn-danger remove-output", "aria-label": `Remove output ${o.output_id}` }, "Remove");
          remove.addEventListener("click", () => removeOutput(v, o.output_id, row.name));
          row.tr.append(el("td", {}, remove));
        }
        v.outputRows.set(o.output_id, row);
      }
      row.name = o.output_name;
      const body = v.outputsBody;
      if (body.children[index] !== row.tr) body.insertBefore(row.tr, body.children[index] || null);
      const [name, id, type, state, rate, sent, dropped] = row.cells;
      name.textContent = o.output_name;
      id.textContent = o.output_id;
      type.textContent = o.output_type;
      state.replaceChildren(badge(o.state, "state-out-" + o.state));
      rate.textContent = fmt.bitrate(o.bitrate_bps);
      sent.textContent = fmt.count(o.packets_sent);
      dropped.textContent = fmt.count(o.packets_dropped);
    });
    for (const [id, row] of v.outputRows) {
      if (!seen.has(id)) { row.tr.remove(); v.outputRows.delete(id); }
    }
    const emptyRow = v.outputsBody.querySelector("tr.empty");
    if (!outputs.length && !emptyRow) v.outputsBody.append(el("tr", { class: "empty" }, el("td", { colspan: canOperate ? 8 : 7, class: "muted" }, "No outputs.")));
    if (outputs.length && emptyRow) emptyRow.remove();
  }

  function srtLegs(flow) {
    const legs = [];
    const input = flow.input || {};
    if (input.srt_stats) legs.push(["Input", input.srt_stats]);
    if (input.srt_leg2_stats) legs.push(["Input leg 2", input.srt_leg2_stats]);
    for (const o of flow.outputs || []) {
      if (o.srt_stats) legs.push([o.output_name, o.srt_stats]);
      if (o.srt_leg2_stats) legs.push([o.output_name + " leg 2", o.srt_leg2_stats]);
    }
    if (!legs.length) return [];
    const head = el("tr", {}, ["SRT leg", "State", "RTT", "Send", "Receive", "Lost", "Retransmitted", "Up"].map((h, i) =>
      el("th", { scope: "col", class: i >= 2 ? "num" : "" }, h)));
    const rows = legs.map(([name, s]) => el("tr", {},
      el("td", {}, name), el("td", {}, s.state), el("td", { class: "num" }, s.rtt_ms.toFixed(1) + " ms"),
      el("td", { class: "num" }, s.send_rate_mbps.toFixed(2) + " Mb/s"), el("td", { class: "num" }, s.recv_rate_mbps.toFixed(2) + " Mb/s"),
      el("td", { class: "num" }, fmt.count(s.pkt_loss_total)), el("td", { class: "num" }, fmt.count(s.pkt_retransmit_total)),
      el("td", { class: "num" }, fmt.duration(s.uptime_ms / 1000))));
    return [el("h4", {}, "SRT"), el("div", { class: "table-wrap" }, el("table", { class: "srt-legs" }, el("thead", {}, head), el("tbody", {}, rows)))];
  }

  // ------------------------------------------------------------------ flow commands (operator)
  async function flowCommand(v, action, label) {
    v.pending = true;
    for (const b of Object.values(v.buttons)) b.disabled = true;
    v.result.className = "cmd-result muted";
    v.result.textContent = `${label}: sent…`;
    const answer = await MP.command(nodeId, action);
    v.pending = false;
    for (const b of Object.values(v.buttons)) b.disabled = false;
    if (answer.ok) {
      v.result.className = "cmd-result form-ok";
      v.result.textContent = `${label}: ok`;
    } else {
      v.result.className = "cmd-result form-error";
      v.result.textContent = `${label} failed (${errorText(answer)})`;
      MP.toast(`${label} flow ${action.flow_id} failed: ${answer.error}`, "error");
    }
    refreshEventsSoon();
    if (answer.ok && (action.type === "add_output" || action.type === "remove_output")) configChanged();
    return answer;
  }

  async function removeOutput(v, outputId, name) {
    const yes = await confirmDialog(`Remove output “${name || outputId}” (${outputId}) from flow ${v.id}? It stops sending at once.`, "Remove output");
    if (!yes) return;
    await flowCommand(v, { type: "remove_output", flow_id: v.id, output_id: outputId }, `Remove output ${outputId}`);
  }

  function addOutputForm(v) {
    const uid = "ao-" + v.id.replace(/[^A-Za-z0-9_-]/g, "_");
    const idInput = el("input", { id: uid + "-id", name: "id", required: true, pattern: "[A-Za-z0-9_.\\-]{1,64}", maxlength: 64, autocomplete: "off" });
    const nameInput = el("input", { id: uid + "-name", name: "name", required: true, maxlength: 256, autocomplete: "off" });
    const typeSelect = el("select", { id: uid + "-type", name: "type" },
      el("option", { value: "udp" }, "UDP (MPEG-TS)"), el("option", { value: "json" }, "Other type (JSON)"));
    const addr = el("input", { id: uid + "-addr", name: "addr", value: "127.0.0.1", autocomplete: "off", class: "mono" });
    const port = el("input", { id: uid + "-port", name: "port", type: "number", min: 1, max: 65535, autocomplete: "off" });
    const json = el("textarea", { id: uid + "-json", name: "json", rows: 6, spellcheck: "false",
      placeholder: '{"type": "srt", "mode": "caller", "local_addr": "0.0.0.0:0", "remote_addr": "203.0.113.7:9000"}' });
    const udpFields = el("div", { class: "row" },
      el("div", { class: "field" }, el("label", { for: addr.id }, "Destination address"), addr),
      el("div", { class: "field" }, el("label", { for: port.id }, "Port"), port));
    const jsonFields = el("div", { class: "field", hidden: true }, el("label", { for: json.id }, "Output (JSON; id and name are taken from the fields above when left out)"), json);
    const message = el("p", { class: "form-error", role: "alert", hidden: true });
    const submit = el("button", { type: "submit", class: "btn btn-primary btn-small" }, "Add output");
    typeSelect.addEventListener("change", () => {
      const isJson = typeSelect.value === "json";
      udpFields.hidden = isJson;
      jsonFields.hidden = !isJson;
    });
    const form = el("form", { class: "add-output-form", novalidate: true },
      el("div", { class: "row" },
        el("div", { class: "field" }, el("label", { for: idInput.id }, "Output id"), idInput),
        el("div", { class: "field" }, el("label", { for: nameInput.id }, "Name"), nameInput),
        el("div", { class: "field" }, el("label", { for: typeSelect.id }, "Type"), typeSelect)),
      udpFields, jsonFields, message, el("div", { class: "toolbar" }, submit));
    const fail = (text) => { message.hidden = false; message.textContent = text; };
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      message.hidden = true;
      let output;
      if (typeSelect.value === "json") {
        try { output = JSON.parse(json.value); } catch (err) { return fail("The output is not valid JSON: " + err.message); }
        if (!output || typeof output !== "object" || Array.isArray(output)) return fail("The output must be a JSON object.");
        if (typeof output.type !== "string" || !output.type) return fail("The output needs a \"type\".");
        if (output.id === undefined && idInput.value.trim()) output.id = idInput.value.trim();
        if (output.name === undefined && nameInput.value.trim()) output.name = nameInput.value.trim();
      } else {
        const p = Number(port.value);
        if (!addr.value.trim()) return fail("Enter the destination address (an IP address).");
        if (!Number.isInteger(p) || p < 1 || p > 65535) return fail("Enter a port from 1 to 65535.");
        output = { type: "udp", id: idInput.value.trim(), name: nameInput.value.trim(), dest_addr: addrPort(addr.value.trim(), p) };
      }
      if (typeof output.id !== "string" || !/^[A-Za-z0-9_.-]{1,64}$/.test(output.id)) return fail("The output id is 1–64 characters of letters, digits, _ . -");
      if (typeof output.name !== "string" || !output.name.trim()) return fail("The output needs a name.");
      if (v.outputRows.has(output.id)) return fail(`Flow ${v.id} already has an output “${output.id}”.`);
      submit.disabled = true;
      const answer = await flowCommand(v, { type: "add_output", flow_id: v.id, output }, `Add output ${output.id}`);
      submit.disabled = false;
      if (answer.ok) { form.reset(); typeSelect.dispatchEvent(new Event("change")); }
      else fail("The node refused the output: " + errorText(answer));
    });
    return el("details", { class: "add-output" }, el("summary", {}, "Add output"), form);
  }

  // ------------------------------------------------------------------ bit-rate charts
  function seriesFor(flowId) {
    let s = series.get(flowId);
    if (!s) { s = { t: [], input: [], output: [] }; series.set(flowId, s); }
    return s;
  }

  function record(flowId, t, inBps, outBps) {
    const s = seriesFor(flowId);
    const last = s.t.length ? s.t[s.t.length - 1] : -Infinity;
    if (t - last < 0.5) return; // the same tick again (a heartbeat frame)
    s.t.push(t); s.input.push(inBps || 0); s.output.push(outBps || 0);
    trim(s, t);
  }

  function trim(s, now) {
    let cut = 0;
    while (cut < s.t.length && s.t[cut] < now - WINDOW_S) cut++;
    if (cut) { s.t.splice(0, cut); s.input.splice(0, cut); s.output.splice(0, cut); }
  }

  async function loadHistory() {
    const answer = await api("GET", `${base}/history?seconds=${WINDOW_S}`);
    if (!answer.ok) { MP.toast("The bit-rate history could not be read: " + answer.error, "error"); return; }
    for (const f of answer.data.flows || []) {
      const s = seriesFor(f.flow_id);
      const first = s.t.length ? s.t[0] : Infinity;
      const keep = f.t.map((t, i) => i).filter((i) => f.t[i] < first - 0.5);
      s.t.unshift(...keep.map((i) => f.t[i]));
      s.input.unshift(...keep.map((i) => f.input_bps[i]));
      s.output.unshift(...keep.map((i) => f.output_bps[i]));
      const view = views.get(f.flow_id);
      if (view) drawChart(view);
    }
  }

  function clock(ts) { return new Date(ts * 1000).toLocaleTimeString(undefined, { hour12: false }); }

  function chartWidth(box) { return Math.max(240, Math.floor(box.clientWidth || 480)); }

  function drawChart(v) {
    const s = seriesFor(v.id);
    const data = [s.t, s.input, s.output];
    v.chartBox.dataset.points = String(s.t.length);
    if (typeof window.uPlot !== "function") {
      if (!v.chartBox.firstChild) v.chartBox.append(el("p", { class: "form-error" }, "The chart script is missing (make vendor)."));
      return;
    }
    if (v.chart) { v.chart.setData(data); return; }
    if (!v.card.isConnected) return;
    const axis = { stroke: "#9aa7b4", grid: { stroke: "#2d3643", width: 1 }, ticks: { stroke: "#2d3643", width: 1 }, font: "12px system-ui, sans-serif" };
    const opts = {
      width: chartWidth(v.chartBox),
      height: 190,
      cursor: { drag: { x: false, y: false } },
      scales: {
        // At least the last minute is shown, so the first samples do not fill the chart sideways.
        x: { time: true, range: (u, min, max) => [Math.min(min, max - 60), max] },
        y: { range: (u, min, max) => [0, Math.max(1000, max * 1.15)] },
      },
      axes: [
        { ...axis, space: 70, values: (u, ticks) => ticks.map(clock) },
        { ...axis, size: 56, values: (u, ticks) => ticks.map(shortBps) },
      ],
      series: [
        { label: "Time", value: (u, ts) => (ts === null ? "–" : clock(ts)) },
        { label: "Input", stroke: "#58a6ff", width: 2, fill: "rgba(88, 166, 255, 0.14)", value: (u, b) => fmt.bitrate(b === null ? null : Math.round(b)), points: { show: false } },
        { label: "Outputs", stroke: "#3fb950", width: 1.5, dash: [5, 4], value: (u, b) => fmt.bitrate(b === null ? null : Math.round(b)), points: { show: false } },
      ],
    };
    v.chart = new uPlot(opts, data, v.chartBox);
    v.resize = new ResizeObserver(() => {
      const width = chartWidth(v.chartBox);
      if (v.chart && Math.abs(width - v.chart.width) > 2) v.chart.setSize({ width, height: 190 });
    });
    v.resize.observe(v.chartBox);
  }

  // ------------------------------------------------------------------ tunnels (edge)
  function renderTunnels(stats) {
    const body = $("tunnels-body");
    const tunnels = stats && Array.isArray(stats.tunnels) ? stats.tunnels : [];
    if (!tunnels.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 10, class: "muted" }, stats ? "This node has no tunnels." : "No live statistics.")));
      return;
    }
    body.replaceChildren(...tunnels.map((t) => {
      const c = t.stats || {};
      return el("tr", { dataset: { tunnelId: t.id } },
        el("td", {}, t.name), el("td", {}, t.protocol + (t.transport ? ` / ${t.transport}` : "")), el("td", {}, t.mode),
        el("td", {}, t.direction), el("td", {}, badge(t.state, "dot state-" + t.state)),
        el("td", { class: "mono" }, t.local_addr || "–"), el("td", { class: "mono" }, t.relay_addr || "–"),
        el("td", { class: "num" }, fmt.bytes(c.bytes_sent)), el("td", { class: "num" }, fmt.bytes(c.bytes_received)),
        el("td", { class: "num" }, fmt.count(c.dropped)));
    }));
  }

  // ------------------------------------------------------------------ relay
  function plainValue(key, value) {
    if (value === null || value === undefined) return "–";
    if (typeof value === "number") {
      if (key.endsWith("_bps")) return fmt.bitrate(value);
      if (key.endsWith("uptime_secs") || key.endsWith("_secs")) return fmt.duration(value);
      if (key.includes("bytes")) return fmt.bytes(value);
      return fmt.count(value);
    }
    if (typeof value === "boolean") return value ? "yes" : "no";
    if (Array.isArray(value) && value.every((x) => typeof x !== "object")) return value.join(", ") || "–";
    if (typeof value === "object") return el("code", {}, JSON.stringify(value));
    return String(value);
  }

  /* key → value rows; a nested plain object is one level of "parent › key" rows. */
  function plainRows(obj, prefix) {
    const rows = [];
    for (const key of Object.keys(obj).sort()) {
      const value = obj[key];
      const label = (prefix ? prefix + " › " : "") + key.replace(/_/g, " ");
      if (!prefix && value && typeof value === "object" && !Array.isArray(value)) rows.push(...plainRows(value, label));
      else rows.push(el("tr", {}, el("th", { scope: "row" }, label), el("td", { class: "mono" }, plainValue(key, value))));
    }
    return rows;
  }

  function plainTable(obj, emptyText) {
    if (!obj || typeof obj !== "object") return el("p", { class: "muted" }, emptyText);
    return el("table", { class: "plain" }, el("tbody", {}, plainRows(obj, "")));
  }

  function renderRelay(stats, health) {
    $("relay-stats").replaceChildren(plainTable(stats, "No live statistics (the relay is not connected)."));
    $("relay-health").replaceChildren(plainTable(health, "No health report yet."));
  }

  // ------------------------------------------------------------------ events
  let eventsTimer = null;
  async function loadEvents() {
    clearTimeout(eventsTimer);
    const answer = await api("GET", `/api/v1/events?node_id=${encodeURIComponent(nodeId)}&per_page=20`);
    const body = $("events-body");
    if (!answer.ok) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "form-error" }, "The events could not be read: " + errorText(answer))));
    } else if (!answer.data.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No events for this node.")));
    } else {
      body.replaceChildren(...answer.data.map((e) => el("tr", { dataset: { eventId: e.id } },
        el("td", { class: "nowrap" }, fmt.time(e.created_at)),
        el("td", {}, badge(e.severity, "sev-" + e.severity)),
        el("td", {}, e.category),
        el("td", { class: "mono" }, e.flow_id || ""),
        el("td", {}, e.message))));
    }
    eventsTimer = setTimeout(loadEvents, EVENTS_EVERY_MS);
  }
  function refreshEventsSoon() { clearTimeout(eventsTimer); eventsTimer = setTimeout(loadEvents, 1500); }

  // ------------------------------------------------------------------ config editor (operator, edge)
  const editor = {
    loadedText: null, checked: null,
    text: $("config-text"), status: $("config-status"), problems: $("config-problems"),
    diff: $("config-diff"), diffPane: $("config-diff-pane"), panes: $("config-panes"), send: $("config-send"), validate: $("config-validate"), reload: $("config-reload"),
  };

  function say(text, kind) {
    editor.status.className = kind === "error" ? "form-error" : kind === "ok" ? "form-ok" : "muted";
    editor.status.textContent = text;
  }
  function listProblems(problems) {
    editor.problems.hidden = !problems.length;
    editor.problems.replaceChildren(...problems.map((p) => el("li", {}, p)));
  }
  function showDiff(shown) {
    editor.diffPane.hidden = !shown;
    editor.panes.classList.toggle("with-diff", shown);
  }
  function resetCheck() {
    editor.checked = null;
    editor.send.disabled = true;
  }

  /* The node's config changed under the editor (an output added or removed here): reload it when
   * not being edited, else say so (a send would otherwise undo the change). */
  function configChanged() {
    if (!editor.text || editor.loadedText === null) return;
    if (editor.text.value === editor.loadedText) { loadConfig(); return; }
    resetCheck();
    say("The node's configuration changed since it was loaded: reload it (your edits are discarded) before sending.", "error");
  }

  async function loadConfig() {
    if (!editor.text) return;
    say("Loading the configuration from the node…");
    editor.reload.disabled = true;
    const answer = await api("GET", `${base}/config`);
    editor.reload.disabled = false;
    if (!answer.ok) {
      say("The configuration could not be loaded: " + errorText(answer), "error");
      return;
    }
    editor.loadedText = JSON.stringify(answer.data, null, 2);
    editor.text.value = editor.loadedText;
    resetCheck();
    listProblems([]);
    showDiff(false);
    $("config-loaded").textContent = "Loaded " + new Date().toLocaleTimeString(undefined, { hour12: false });
    say("Configuration loaded.", "ok");
  }

  /* The basics the edge would refuse anyway (interop.md 2, 2.2): found here before anything is sent. */
  function checkConfig(config) {
    const problems = [];
    if (!config || typeof config !== "object" || Array.isArray(config)) return ["The configuration must be a JSON object."];
    if (config.version !== 1) problems.push("\"version\" must be 1.");
    if (!Array.isArray(config.flows)) {
      problems.push("\"flows\" must be an array.");
      return problems;
    }
    const flowIds = new Set();
    config.flows.forEach((flow, i) => {
      const where = `flows[${i}]`;
      if (!flow || typeof flow !== "object" || Array.isArray(flow)) { problems.push(`${where} must be an object.`); return; }
      if (typeof flow.id !== "string" || !flow.id) problems.push(`${where}.id must be a non-empty string.`);
      else if (flowIds.has(flow.id)) problems.push(`${where}.id "${flow.id}" is used by another flow.`);
      else flowIds.add(flow.id);
      if (!flow.input || typeof flow.input !== "object" || Array.isArray(flow.input)) problems.push(`${where}.input must be an object.`);
      if (flow.outputs !== undefined) {
        if (!Array.isArray(flow.outputs)) { problems.push(`${where}.outputs must be an array.`); return; }
        const outIds = new Set();
        flow.outputs.forEach((out, j) => {
          const at = `${where}.outputs[${j}]`;
          if (!out || typeof out !== "object" || Array.isArray(out)) { problems.push(`${at} must be an object.`); return; }
          if (typeof out.id !== "string" || !out.id) problems.push(`${at}.id must be a non-empty string.`);
          else if (outIds.has(out.id)) problems.push(`${at}.id "${out.id}" is used by another output of this flow.`);
          else outIds.add(out.id);
        });
      }
    });
    return problems;
  }

  async function validateConfig() {
    resetCheck();
    listProblems([]);
    showDiff(false);
    if (editor.loadedText === null) { say("Load the configuration first.", "error"); return; }
    let config;
    try {
      config = JSON.parse(editor.text.value);
    } catch (err) {
      say("Invalid JSON: " + err.message, "error");
      return;
    }
    const problems = checkConfig(config);
    if (problems.length) {
      say(`The configuration has ${problems.length} problem(s); nothing was sent.`, "error");
      listProblems(problems);
      return;
    }
    const after = JSON.stringify(config, null, 2);
    MP.renderDiff(editor.diff, editor.loadedText, after);
    showDiff(true);
    const firstChange = editor.diff.querySelector(".add, .del");
    if (firstChange) editor.diff.scrollTop = Math.max(0, firstChange.offsetTop - editor.diff.offsetTop - 60);
    if (after === editor.loadedText) { say("No changes against the loaded configuration.", "muted"); return; }
    // The edge's own model, on the manager (nothing is sent to the node).
    editor.validate.disabled = true;
    const answer = await api("POST", `${base}/config/validate`, config);
    editor.validate.disabled = false;
    if (answer.ok && answer.data && answer.data.valid === false) {
      const found = (answer.data.errors || []).map((e) => `${e.path || "(config)"}: ${e.message}`);
      say(`The node would refuse this configuration (${found.length} problem(s)); nothing was sent.`, "error");
      listProblems(found);
      return;
    }
    if (!answer.ok) {
      say("Checked here (the manager's check failed: " + errorText(answer) + "). The changes are below: send them to apply.", "muted");
    } else {
      say("Valid. The changes are below: send them to apply.", "ok");
    }
    editor.checked = { text: editor.text.value, config };
    editor.send.disabled = false;
  }

  async function sendConfig() {
    if (!editor.checked || editor.checked.text !== editor.text.value) { resetCheck(); say("Validate the configuration first.", "error"); return; }
    const yes = await confirmDialog("Send this configuration to the node? Changed flows restart, removed flows stop.", "Send");
    if (!yes) return;
    editor.send.disabled = true;
    say("Sending to the node…");
    const answer = await api("PUT", `${base}/config`, editor.checked.config);
    if (!answer.ok) {
      say("The configuration was not applied: " + errorText(answer), "error");
      const details = answer.data && Array.isArray(answer.data.errors) ? answer.data.errors.map((e) => `${e.path || ""}: ${e.message}`) : [];
      listProblems(details);
      editor.send.disabled = false;
      return;
    }
    MP.toast("The node applied the configuration.", "ok");
    refreshEventsSoon();
    await loadConfig();
    say("Sent: the node applied the configuration.", "ok");
  }

  if (editor.text) {
    editor.text.addEventListener("input", () => {
      if (editor.checked) { resetCheck(); say("Edited since the last validation: validate again.", "muted"); }
    });
    editor.validate.addEventListener("click", validateConfig);
    editor.send.addEventListener("click", sendConfig);
    editor.reload.addEventListener("click", async () => {
      if (editor.loadedText !== null && editor.text.value !== editor.loadedText) {
        if (!(await confirmDialog("Discard your edits and load the node's configuration again?", "Discard edits"))) return;
      }
      loadConfig();
    });
  }

  // ------------------------------------------------------------------ start
  window.__mpNode = { views, series };
  /* The first read also loads the history and the config: retried until it succeeds, except
   * for a node that does not exist (or that this user may not see). */
  async function start() {
    const found = await loadNode(true);
    if (found) { setInterval(() => loadNode(false), NODE_EVERY_MS); return; }
    if (!node && !/does not exist/.test($("node-error").textContent)) setTimeout(start, 5000);
  }
  start();
  loadEvents();
  MP.dashboard(onUpdate);
})();
