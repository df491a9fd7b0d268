/* The tunnels page (/tunnels): the tunnels the fleet's edges report, live, and pairing/unpairing.
 *
 * - Live data: each edge's stats on /ws/dashboard carry `stats.tunnels[]` (tunnel summaries:
 *   id, name, protocol, mode, direction, transport, state, local_addr, relay_addr, stats{…}).
 *   The two legs of one tunnel id are grouped: the source leg has direction "egress", the sink
 *   leg "ingress" (interop.md 2.6). Rows are keyed by tunnel id and updated in place, so the
 *   keyboard focus survives the 1 s updates.
 * - Operators and above: "Pair two edges" (POST /api/v1/tunnels, docs/manager.md "Pairing a
 *   tunnel") and Remove per tunnel: delete_tunnel to each edge holding a leg, then revoke_tunnel
 *   to the relay (the relay whose health names the legs' relay_addr; else every online relay,
 *   where "has no authorization" is not an error); close_tunnel too when an edge could not delete
 *   its leg, so a leg still bound at the relay is torn down.
 */
"use strict";

(function () {
  const el = MP.el;
  const $ = (id) => document.getElementById(id);
  const canOperate = MP.can("operator") && !!$("pair-form");

  const rowsBody = $("tn-rows");
  const countText = $("tn-count");
  const emptyText = $("tn-empty");
  const errorBox = $("tn-error");

  const nodes = new Map(); // node_id -> dashboard node
  const lastHealth = new Map(); // node_id -> last_health from GET /api/v1/nodes (offline relays)
  const rows = new Map(); // tunnel id -> {tr, refs, tunnel}
  const rates = new Map(); // "<tunnel>/<node>/<counter>" -> {bytes, at, bps}
  const removing = new Map(); // tunnel id -> {text, kind, done}
  let fresh = null; // the id of the tunnel this page just paired (highlighted)
  let received = false;
  let known = new Map(); // tunnel id -> the last grouping (stale legs of offline edges)

  /* ------------------------------------------------------------------ helpers */
  function nodeName(id) {
    const node = nodes.get(id);
    return node ? node.name : id ? id.slice(0, 8) + "…" : "–";
  }

  function healthOf(id) {
    const node = nodes.get(id);
    return (node && node.health) || lastHealth.get(id) || null;
  }

  function online(node) {
    return node && ["online", "degraded", "error"].includes(node.status);
  }

  /* bytes/s from the change since the last report, smoothed a little */
  function rate(key, bytes, at) {
    const before = rates.get(key);
    let bps = before ? before.bps : null;
    if (before && at > before.at) {
      const now = Math.max(0, ((bytes - before.bytes) * 8) / ((at - before.at) / 1000));
      bps = before.bps === null ? now : before.bps * 0.5 + now * 0.5;
    }
    rates.set(key, { bytes, at, bps });
    return bps;
  }

  /* ------------------------------------------------------------------ grouping */
  function group() {
    const tunnels = new Map();
    for (const node of nodes.values()) {
      if (node.device_type !== "edge" || !node.stats || !Array.isArray(node.stats.tunnels)) continue;
      for (const leg of node.stats.tunnels) {
        if (!leg || !leg.id) continue;
        let tunnel = tunnels.get(leg.id);
        if (!tunnel) {
          tunnel = { id: leg.id, name: leg.name, protocol: leg.protocol, mode: leg.mode, transport: leg.transport,
            relay_addr: leg.relay_addr, enabled: leg.enabled, source: null, sink: null, extra: [] };
          tunnels.set(leg.id, tunnel);
        }
        const side = { node_id: node.node_id, leg };
        if (leg.direction === "egress" && !tunnel.source) tunnel.source = side;
        else if (leg.direction === "ingress" && !tunnel.sink) tunnel.sink = side;
        else tunnel.extra.push(side);
        if (!tunnel.relay_addr && leg.relay_addr) tunnel.relay_addr = leg.relay_addr;
        if (leg.direction === "egress") tunnel.name = leg.name; // the source's name wins
      }
    }
    // A leg whose edge went offline is no longer reported (the manager streams stats of
    // connected nodes only): keep the last one seen, marked stale, while that edge is offline.
    for (const before of known.values()) {
      for (const role of ["source", "sink"]) {
        const side = before[role];
        const node = side && nodes.get(side.node_id);
        if (!side || !node || online(node)) continue;
        let tunnel = tunnels.get(before.id);
        if (!tunnel) { tunnel = { ...before, source: null, sink: null, extra: [] }; tunnels.set(before.id, tunnel); }
        if (!tunnel[role]) tunnel[role] = { ...side, stale: true };
      }
    }
    known = tunnels;
    return [...tunnels.values()].sort((a, b) => (a.name || "").localeCompare(b.name || "") || a.id.localeCompare(b.id));
  }

  function relaysFor(relayAddr) {
    const all = [...nodes.values()].filter((n) => n.device_type === "relay");
    if (!relayAddr) return { matched: [], all };
    const matched = all.filter((n) => {
      const h = healthOf(n.node_id) || {};
      return [h.public_quic_addr, h.quic_addr, h.public_udp_addr].includes(relayAddr);
    });
    return { matched, all };
  }

  /* ------------------------------------------------------------------ rows */
  function legCell(title) {
    const name = el("a", { class: "tn-node" });
    const badge = el("span", { class: "badge" });
    const status = el("span", { class: "tn-node-status" });
    const addr = el("span", { class: "mono tn-addr" });
    const bytes = el("span", { class: "tn-bytes" });
    const none = el("span", { class: "muted" }, "no leg reported");
    const cell = el("td", { class: "tn-leg", "aria-label": title },
      el("div", { class: "tn-leg-head" }, name, status, badge), el("div", {}, addr), el("div", {}, bytes), none);
    return { cell, name, badge, status, addr, bytes, none };
  }

  function fillLeg(refs, side) {
    const present = !!side;
    for (const item of [refs.name, refs.badge, refs.addr, refs.bytes]) item.hidden = !present;
    refs.none.hidden = present;
    refs.status.hidden = true;
    if (!present) return;
    const node = nodes.get(side.node_id);
    const leg = side.leg;
    refs.name.textContent = nodeName(side.node_id);
    refs.name.href = "/nodes/" + encodeURIComponent(side.node_id);
    refs.name.title = side.node_id;
    if (node && !online(node)) { refs.status.hidden = false; refs.status.textContent = node.status; }
    const state = side.stale ? "Unknown" : leg.state || "Unknown";
    refs.badge.textContent = side.stale ? "last: " + (leg.state || "?") : state;
    refs.badge.title = side.stale ? "The edge is offline: this is the last state it reported" : "";
    refs.badge.className = side.stale ? "badge dot state-offline" : `badge dot state-${state}`;
    refs.badge.dataset.state = state;
    refs.addr.textContent = leg.local_addr || "";
    refs.addr.title = leg.direction === "egress" ? "listens here for local traffic" : "delivers tunnel traffic here";
    const s = leg.stats || {};
    refs.bytes.textContent = `↑ ${MP.fmt.bytes(s.bytes_sent)}  ↓ ${MP.fmt.bytes(s.bytes_received)}`;
    refs.bytes.title = `sent ${MP.fmt.count(s.bytes_sent)} B, received ${MP.fmt.count(s.bytes_received)} B` +
      (s.datagrams_sent !== undefined ? `; datagrams sent ${MP.fmt.count(s.datagrams_sent)}, received ${MP.fmt.count(s.datagrams_received)}` : "") +
      (s.dropped ? `; dropped ${MP.fmt.count(s.dropped)}` : "") + (s.decrypt_errors ? `; decrypt errors ${MP.fmt.count(s.decrypt_errors)}` : "");
    refs.cell.dataset.state = state;
  }

  function makeRow(tunnel) {
    const name = el("span", { class: "tn-name" });
    const id = el("span", { class: "mono muted tn-id" });
    const disabled = el("span", { class: "badge state-Stopped tn-disabled" }, "disabled");
    const type = el("td", { class: "tn-type" });
    const source = legCell("Source edge");
    const sink = legCell("Sink edge");
    const relayAddr = el("span", { class: "mono" });
    const relayName = el("span", { class: "muted tn-relay-name" });
    const rateText = el("span", { class: "tn-rate" });
    const totals = el("span", { class: "muted tn-totals" });
    const cells = [
      el("td", { class: "tn-title" }, name, el("br"), id, disabled),
      type, source.cell, sink.cell,
      el("td", { class: "tn-relay" }, relayAddr, el("br"), relayName),
      el("td", { class: "num tn-traffic" }, rateText, el("br"), totals),
    ];
    const refs = { name, id, disabled, type, source, sink, relayAddr, relayName, rateText, totals };
    if (canOperate) {
      const remove = el("button", { type: "button", class: "btn btn-small btn-danger tn-remove" }, "Remove");
      const progress = el("div", { class: "tn-progress", role: "status" });
      remove.addEventListener("click", () => { const entry = rows.get(tunnel.id); if (entry) confirmRemove(entry.tunnel); });
      cells.push(el("td", { class: "tn-actions" }, remove, progress));
      refs.remove = remove;
      refs.progress = progress;
    }
    const tr = el("tr", { class: "tn-row", dataset: { id: tunnel.id } }, cells);
    return { tr, refs, tunnel };
  }

  function fillRow(entry, tunnel, at) {
    const r = entry.refs;
    entry.tunnel = tunnel;
    r.name.textContent = tunnel.name || "(unnamed)";
    r.id.textContent = tunnel.id.slice(0, 8);
    r.id.title = tunnel.id;
    r.disabled.hidden = tunnel.enabled !== false;
    r.type.textContent = [tunnel.protocol, tunnel.mode, tunnel.mode === "relay" ? tunnel.transport : null]
      .filter(Boolean).join(" · ");
    fillLeg(r.source, tunnel.source);
    fillLeg(r.sink, tunnel.sink);
    r.relayAddr.textContent = tunnel.relay_addr || (tunnel.mode === "direct" ? "direct" : "–");
    const { matched } = relaysFor(tunnel.relay_addr);
    r.relayName.textContent = matched.length ? matched.map((n) => n.name).join(", ") : "";
    const sent = tunnel.source ? (tunnel.source.leg.stats || {}).bytes_sent : null;
    const got = tunnel.sink ? (tunnel.sink.leg.stats || {}).bytes_received : null;
    const bps = sent === null || sent === undefined ? null : rate(`${tunnel.id}/${tunnel.source.node_id}/sent`, sent, at);
    r.rateText.textContent = bps === null ? "–" : MP.fmt.bitrate(Math.round(bps));
    r.rateText.title = "into the tunnel at the source";
    r.totals.textContent = `${MP.fmt.bytes(sent)} in · ${MP.fmt.bytes(got)} out`;
    r.totals.title = "bytes sent by the source leg · bytes received by the sink leg";
    const live = (side) => side && !side.stale && side.leg.state === "Connected";
    const connected = live(tunnel.source) && live(tunnel.sink);
    entry.tr.dataset.connected = connected ? "true" : "false";
    entry.tr.classList.toggle("tn-fresh", tunnel.id === fresh);
    if (canOperate) {
      const job = removing.get(tunnel.id);
      r.remove.disabled = !!(job && !job.done);
      r.progress.textContent = job ? job.text : "";
      r.progress.className = "tn-progress" + (job && job.kind ? " tn-" + job.kind : "");
    }
  }

  function render() {
    const at = Date.now();
    const tunnels = group();
    const seen = new Set();
    const order = [];
    for (const tunnel of tunnels) {
      seen.add(tunnel.id);
      let entry = rows.get(tunnel.id);
      if (!entry) { entry = makeRow(tunnel); rows.set(tunnel.id, entry); }
      fillRow(entry, tunnel, at);
      order.push(entry.tr);
    }
    for (const [id, entry] of rows) {
      if (seen.has(id)) continue;
      entry.tr.remove();
      rows.delete(id);
      const job = removing.get(id);
      if (job && job.done && job.kind !== "error") removing.delete(id);
      for (const key of [...rates.keys()]) if (key.startsWith(id + "/")) rates.delete(key);
    }
    // Reorder only when the order changed (moving a focused row would drop the focus).
    const current = [...rowsBody.children];
    if (current.length !== order.length || current.some((tr, i) => tr !== order[i])) {
      const focused = document.activeElement;
      rowsBody.replaceChildren(...order);
      if (focused && rowsBody.contains(focused)) focused.focus();
    }
    const connected = tunnels.filter((t) => rows.get(t.id).tr.dataset.connected === "true").length;
    countText.textContent = received
      ? `${tunnels.length} tunnel${tunnels.length === 1 ? "" : "s"} · ${connected} connected`
      : "Waiting for live data…";
    emptyText.hidden = !received || tunnels.length > 0;
  }

  /* ------------------------------------------------------------------ pairing */
  const form = $("pair-form");
  const pick = canOperate ? {
    name: $("p-name"), protocol: $("p-protocol"), transport: $("p-transport"),
    source: $("p-source"), sink: $("p-sink"), relay: $("p-relay"), relayAddr: $("p-relay-addr"),
    sourceAddr: $("p-source-addr"), sinkAddr: $("p-sink-addr"), hint: $("p-relay-hint"),
    submit: $("pair-submit"), error: $("pair-error"), ok: $("pair-ok"),
  } : null;
  let relayAddrTyped = false;
  let selectSignature = "";
  const LOCAL_ADDR = /^(\d{1,3}(\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]):\d{1,5}$/;
  const HOST_PORT = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/;

  function fillSelect(select, list, placeholder, preferIndex) {
    const chosen = select.value;
    select.replaceChildren(el("option", { value: "" }, placeholder), ...list.map((n) =>
      el("option", { value: n.node_id }, n.name + (online(n) ? "" : ` (${n.status})`))));
    if (chosen && list.some((n) => n.node_id === chosen)) select.value = chosen;
    else if (!chosen && list.length > preferIndex) {
      const candidate = list.filter(online)[preferIndex];
      select.value = candidate ? candidate.node_id : "";
    }
  }

  function refreshSelects() {
    if (!canOperate) return;
    const all = [...nodes.values()].sort((a, b) => a.name.localeCompare(b.name));
    const edges = all.filter((n) => n.device_type === "edge");
    const relays = all.filter((n) => n.device_type === "relay");
    const signature = all.map((n) => `${n.node_id}|${n.name}|${n.device_type}|${online(n)}`).join(",");
    if (signature === selectSignature) return;
    selectSignature = signature;
    fillSelect(pick.source, edges, "Choose the source edge…", 0);
    fillSelect(pick.sink, edges, "Choose the sink edge…", 1);
    fillSelect(pick.relay, relays, "Choose a relay…", 0);
    suggestRelayAddr();
  }

  function unspecified(host) {
    return ["0.0.0.0", "::", "[::]", ""].includes(host);
  }

  function suggestRelayAddr() {
    if (!canOperate) return;
    const id = pick.relay.value;
    const health = id ? healthOf(id) : null;
    const udp = pick.transport.value === "udp";
    let value = "", hint = "";
    if (!id) hint = "Choose the relay the edges dial.";
    else if (!health) hint = "The relay has sent no health report yet: enter the address the edges can reach.";
    else {
      const quic = health.public_quic_addr || health.quic_addr || "";
      if (udp) {
        if (health.public_udp_addr) { value = health.public_udp_addr; hint = "From the relay's health: public_udp_addr."; }
        else if (quic) {
          const host = quic.replace(/:\d+$/, "");
          if (!unspecified(host)) { value = host + ":4434"; hint = "The relay's host with the native UDP plane's default port 4434: check it."; }
        }
      } else if (health.public_quic_addr) { value = health.public_quic_addr; hint = "From the relay's health: public_quic_addr."; }
      else if (health.quic_addr) {
        const host = health.quic_addr.replace(/:\d+$/, "");
        if (unspecified(host)) hint = `The relay listens on ${health.quic_addr} (every address): enter the address the edges can reach.`;
        else { value = health.quic_addr; hint = "From the relay's health: quic_addr."; }
      }
      if (!value && !hint) hint = "Enter the address the edges can reach.";
    }
    if (!relayAddrTyped) pick.relayAddr.value = value;
    pick.hint.textContent = relayAddrTyped ? "Typed by you; clear it to take the relay's address again." : hint;
  }

  function formProblem() {
    const p = pick;
    if (!p.name.value.trim()) return [p.name, "Give the tunnel a name."];
    if (!p.source.value) return [p.source, "Choose the source edge."];
    if (!p.sink.value) return [p.sink, "Choose the sink edge."];
    if (p.source.value === p.sink.value) return [p.sink, "The source and the sink must be two different edges."];
    if (!LOCAL_ADDR.test(p.sourceAddr.value.trim())) return [p.sourceAddr, "The source local address must be ip:port."];
    if (!LOCAL_ADDR.test(p.sinkAddr.value.trim())) return [p.sinkAddr, "The sink local address must be ip:port."];
    if (!p.relay.value) return [p.relay, "Choose a relay."];
    if (!HOST_PORT.test(p.relayAddr.value.trim())) return [p.relayAddr, "The relay address must be host:port."];
    if (p.protocol.value === "tcp" && p.transport.value === "udp") return [p.transport, "TCP tunnels need the QUIC transport."];
    return null;
  }

  function showPairMessage(kind, text) {
    pick.error.hidden = kind !== "error";
    pick.ok.hidden = kind !== "ok";
    (kind === "error" ? pick.error : pick.ok).textContent = text;
  }

  async function pair(event) {
    event.preventDefault();
    const problem = formProblem();
    for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
    if (problem) {
      problem[0].setAttribute("aria-invalid", "true");
      problem[0].focus();
      showPairMessage("error", problem[1]);
      return;
    }
    const body = {
      name: pick.name.value.trim(),
      protocol: pick.protocol.value,
      mode: "relay",
      transport: pick.transport.value,
      ingress_node_id: pick.source.value,
      egress_node_id: pick.sink.value,
      ingress_local_addr: pick.sourceAddr.value.trim(),
      egress_local_addr: pick.sinkAddr.value.trim(),
      relay_node_id: pick.relay.value,
      relay_addr: pick.relayAddr.value.trim(),
    };
    pick.submit.disabled = true;
    pick.submit.textContent = "Pairing…";
    showPairMessage("ok", "Authorising on the relay, then creating the sink and the source legs…");
    const answer = await MP.api("POST", "/api/v1/tunnels", body);
    pick.submit.disabled = false;
    pick.submit.textContent = "Pair";
    if (answer.status === 201 && answer.data) {
      fresh = answer.data.id;
      showPairMessage("ok", `Paired “${answer.data.name}” (${answer.data.id}), ${answer.data.protocol} over ` +
        `${answer.data.transport}, ${nodeName(answer.data.ingress_node_id)} → ${nodeName(answer.data.egress_node_id)} ` +
        `through ${nodeName(answer.data.relay_node_id)}. Its legs appear above as the edges report them.`);
      MP.toast(`Tunnel “${answer.data.name}” paired`, "ok");
      pick.name.value = "";
      render();
    } else if (answer.status === 0) {
      // No answer came (the connection broke): the manager may have paired it all the same.
      showPairMessage("error", "No answer from the manager: the tunnel may have been paired; it appears above " +
        "when the edges report it. Check before pairing again.");
      MP.toast("Pairing: no answer from the manager", "error");
    } else {
      showPairMessage("error", "Pairing failed: " + (answer.error || `HTTP ${answer.status}`));
      MP.toast("Pairing failed: " + (answer.error || `HTTP ${answer.status}`), "error");
    }
  }

  /* ------------------------------------------------------------------ removing */
  const dialog = $("remove-dialog");
  let pendingRemoval = null;

  function confirmRemove(tunnel) {
    pendingRemoval = tunnel;
    const legs = [tunnel.source, tunnel.sink, ...tunnel.extra].filter(Boolean).map((s) => nodeName(s.node_id));
    $("remove-text").textContent = `Remove “${tunnel.name}” (${tunnel.id})? Its legs on ${legs.join(" and ") || "no edge"} are deleted` +
      (tunnel.relay_addr ? ` and its authorisation at ${tunnel.relay_addr} is revoked.` : ".");
    dialog.returnValue = "";
    dialog.showModal();
    $("remove-cancel").focus();
  }

  function setJob(id, text, kind, done) {
    removing.set(id, { text, kind, done });
    const entry = rows.get(id);
    if (entry) fillRow(entry, entry.tunnel, Date.now());
  }

  function isUnknown(answer) {
    return answer.status === 422 && /no authorization|not found|unknown tunnel/i.test(answer.error || "");
  }

  async function remove(tunnel) {
    const id = tunnel.id;
    const steps = [];
    const failures = [];
    const say = (kind, done) => setJob(id, steps.join(" · "), kind, done);
    const action = (type) => ({ type, tunnel_id: id });
    setJob(id, "Removing…", "", false);
    const legs = [["source", tunnel.source], ["sink", tunnel.sink], ...tunnel.extra.map((s) => ["leg", s])].filter((x) => x[1]);
    let edgeFailed = false;
    for (const [role, side] of legs) {
      steps.push(`${role} ${nodeName(side.node_id)}…`);
      say("", false);
      const answer = await MP.command(side.node_id, action("delete_tunnel"));
      steps[steps.length - 1] = `${role} ${nodeName(side.node_id)} ${answer.ok ? "✓" : "✗"}`;
      if (!answer.ok) { edgeFailed = true; failures.push(`${role} edge ${nodeName(side.node_id)}: ${answer.error}`); }
      say("", false);
    }
    if (tunnel.mode !== "direct") {
      const { matched, all } = relaysFor(tunnel.relay_addr);
      const candidates = matched.length ? matched : all.filter(online);
      if (!candidates.length) failures.push("no relay to revoke the authorisation on (none online matches " + (tunnel.relay_addr || "the tunnel") + ")");
      let revoked = 0;
      for (const relay of candidates) {
        steps.push(`relay ${relay.name}…`);
        say("", false);
        const answer = await MP.command(relay.node_id, action("revoke_tunnel"));
        let mark = "✓";
        if (answer.ok) revoked++;
        else if (isUnknown(answer)) mark = "– (not authorised there)";
        else { mark = "✗"; failures.push(`relay ${relay.name}: ${answer.error}`); }
        if (edgeFailed && answer.status !== 502) {
          // A leg the edge could not delete may still be bound at the relay: tear it down.
          const closed = await MP.command(relay.node_id, action("close_tunnel"));
          if (!closed.ok && !isUnknown(closed)) failures.push(`relay ${relay.name} close_tunnel: ${closed.error}`);
        }
        steps[steps.length - 1] = `relay ${relay.name} ${mark}`;
        say("", false);
      }
      if (candidates.length && !matched.length && !revoked && !failures.length) {
        steps.push("no relay held an authorisation");
      }
    }
    if (failures.length) {
      setJob(id, steps.join(" · ") + " — " + failures.join("; "), "error", true);
      MP.toast(`Removing “${tunnel.name}”: ${failures[0]}`, "error");
    } else {
      setJob(id, steps.join(" · ") + " — removed", "ok", true);
      MP.toast(`Tunnel “${tunnel.name}” removed`, "ok");
    }
  }

  if (canOperate) {
    form.addEventListener("submit", pair);
    pick.relay.addEventListener("change", suggestRelayAddr);
    pick.transport.addEventListener("change", suggestRelayAddr);
    pick.protocol.addEventListener("change", () => {
      const tcp = pick.protocol.value === "tcp";
      pick.transport.querySelector('option[value="udp"]').disabled = tcp;
      if (tcp && pick.transport.value === "udp") { pick.transport.value = "quic"; suggestRelayAddr(); }
    });
    pick.relayAddr.addEventListener("input", () => { relayAddrTyped = pick.relayAddr.value.trim() !== ""; suggestRelayAddr(); });
    dialog.addEventListener("close", () => {
      const tunnel = pendingRemoval;
      pendingRemoval = null;
      if (tunnel && dialog.returnValue === "remove") remove(tunnel);
      const entry = tunnel && rows.get(tunnel.id);
      if (entry && entry.refs.remove) entry.refs.remove.focus();
    });
  }

  /* ------------------------------------------------------------------ data */
  async function loadNodes() {
    const answer = await MP.api("GET", "/api/v1/nodes");
    if (!answer.ok || !Array.isArray(answer.data)) {
      errorBox.textContent = "Nodes could not be listed: " + (answer.error || "unexpected answer");
      errorBox.hidden = false;
      return;
    }
    for (const node of answer.data) {
      if (node.last_health) lastHealth.set(node.id, node.last_health);
      if (!nodes.has(node.id)) {
        nodes.set(node.id, { node_id: node.id, name: node.name, device_type: node.device_type, status: node.status, stats: null, health: null });
      }
    }
    refreshSelects();
    render();
  }

  MP.dashboard((payload) => {
    if (!payload || !Array.isArray(payload.nodes)) return;
    received = true;
    errorBox.hidden = true;
    nodes.clear();
    for (const node of payload.nodes) nodes.set(node.node_id, node);
    refreshSelects();
    if (canOperate && !relayAddrTyped && !pick.relayAddr.value) suggestRelayAddr();
    render();
  });
  loadNodes();
})();
