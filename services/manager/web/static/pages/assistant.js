/* The assistant page (issue 21, interop.md 7.6): the signed-in user's AI keys (GET/POST/DELETE
 * /api/v1/ai/keys), a proposal from POST /api/v1/ai/generate-config shown as a diff of the
 * node's flow config (computed here from GET /nodes/<id>/config), applied only on "Apply"
 * through the normal command route, and a free question through POST /api/v1/ai/query. */
"use strict";

(function () {
  const { api, el, toast, fmt } = MP;
  const $ = (id) => document.getElementById(id);
  const PROVIDERS = [
    { id: "openai", label: "OpenAI", model: "gpt-4.1" },
    { id: "anthropic", label: "Anthropic", model: "claude-sonnet-4-6-20260318" },
    { id: "gemini", label: "Gemini", model: "gemini-2.0-flash" },
  ];
  const FLOW_ACTIONS = new Set(["create_flow", "update_flow", "delete_flow", "add_output", "remove_output"]);
  const RUN_ACTIONS = { start_flow: "Start", stop_flow: "Stop", restart_flow: "Restart" };
  const TUNNEL_ACTIONS = new Set(["create_tunnel", "delete_tunnel"]);

  let keys = [];
  let nodes = [];
  let proposal = null;  // {nodeId, nodeName, commands[]}
  let lastDiff = null;  // {before, after}: the proposal's diff texts

  function show(box, text) { box.textContent = text || ""; box.hidden = !text; }
  function providerLabel(id) { const p = PROVIDERS.find((x) => x.id === id); return p ? p.label : id; }
  function isObject(value) { return value !== null && typeof value === "object" && !Array.isArray(value); }
  function isText(value) { return typeof value === "string" && value.length > 0; }

  /* ---------------------------------------------------------------- keys */
  function fillProviderSelects() {
    const configured = new Set(keys.map((k) => k.provider));
    for (const id of ["gen-provider", "ask-provider"]) {
      const select = $(id);
      const chosen = select.value || "openai";
      select.replaceChildren(...PROVIDERS.map((p) =>
        el("option", { value: p.id }, p.label + (configured.has(p.id) ? "" : " (no key)"))));
      select.value = chosen;
    }
    const keySelect = $("key-provider");
    if (!keySelect.options.length) {
      keySelect.replaceChildren(...PROVIDERS.map((p) => el("option", { value: p.id }, p.label)));
      keySelect.addEventListener("change", syncModelHint);
      syncModelHint();
    }
  }

  function syncModelHint() {
    const p = PROVIDERS.find((x) => x.id === $("key-provider").value);
    $("key-model").placeholder = p ? `default: ${p.model}` : "";
  }

  function renderKeys() {
    const byProvider = new Map(keys.map((k) => [k.provider, k]));
    $("keys-body").replaceChildren(...PROVIDERS.map((p) => {
      const key = byProvider.get(p.id);
      const remove = key ? el("button", {
        type: "button", class: "btn btn-small btn-danger", "aria-label": `Remove the ${p.label} key`,
        onclick: (event) => removeKey(p, event.currentTarget),
      }, "Remove") : null;
      return el("tr", { dataset: { provider: p.id, configured: String(Boolean(key)) } },
        el("td", {}, p.label),
        el("td", {}, key
          ? el("span", {}, el("span", { class: "state-online dot" }, "configured"), el("div", { class: "muted small" }, "updated " + fmt.time(key.updated_at)))
          : el("span", { class: "state-offline" }, "not configured")),
        el("td", { class: "mono small model" }, key ? (key.model_preference || el("span", { class: "muted" }, p.model)) : "–"),
        el("td", { class: "actions" }, remove));
    }));
    fillProviderSelects();
  }

  async function loadKeys() {
    const answer = await api("GET", "/api/v1/ai/keys");
    if (!answer.ok) {
      $("keys-body").replaceChildren(el("tr", {}, el("td", { colspan: 4, class: "form-error" }, "Keys could not be read: " + answer.error)));
      fillProviderSelects();
      return;
    }
    keys = Array.isArray(answer.data) ? answer.data : [];
    renderKeys();
  }

  async function removeKey(provider, button) {
    if (button.dataset.confirm !== "yes") {  // a second click confirms
      button.dataset.confirm = "yes";
      button.textContent = "Confirm remove";
      setTimeout(() => { if (button.isConnected) { button.dataset.confirm = ""; button.textContent = "Remove"; } }, 5000);
      return;
    }
    button.disabled = true;
    const answer = await api("DELETE", "/api/v1/ai/keys", { provider: provider.id });
    if (!answer.ok) { button.disabled = false; toast(`The ${provider.label} key was not removed: ${answer.error}`, "error"); return; }
    toast(`${provider.label} key removed`, "ok");
    await loadKeys();
  }

  $("key-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const provider = $("key-provider").value;
    const apiKey = $("key-value").value.trim();
    const model = $("key-model").value.trim();
    if (!apiKey) { show($("key-error"), "Paste the API key."); $("key-value").focus(); return; }
    if (apiKey.length > 256) { show($("key-error"), "An API key is at most 256 characters."); return; }
    const body = { provider, api_key: apiKey };
    if (model) body.model_preference = model;
    $("key-save").disabled = true;
    const answer = await api("POST", "/api/v1/ai/keys", body);
    $("key-save").disabled = false;
    if (!answer.ok) { show($("key-error"), "Not saved: " + answer.error); return; }
    show($("key-error"), "");
    $("key-value").value = "";
    $("key-model").value = "";
    toast(`${providerLabel(provider)} key saved`, "ok");
    await loadKeys();
  });

  /* ---------------------------------------------------------------- nodes */
  async function loadNodes() {
    const answer = await api("GET", "/api/v1/nodes?device_type=edge");
    const select = $("gen-node");
    if (!answer.ok) {
      select.replaceChildren(el("option", { value: "" }, "Nodes could not be read"));
      show($("gen-error"), "Nodes could not be read: " + answer.error);
      return;
    }
    nodes = (answer.data || []).slice().sort((a, b) => a.name.localeCompare(b.name));
    if (!nodes.length) {
      select.replaceChildren(el("option", { value: "" }, "No edge nodes: proposals cannot be applied"));
      return;
    }
    const connected = (n) => ["online", "degraded", "error"].includes(n.status);
    select.replaceChildren(...nodes.map((n) => el("option", { value: n.id }, `${n.name} · ${n.status}`)));
    const first = nodes.find(connected) || nodes[0];
    select.value = first.id;
  }

  /* ---------------------------------------------------------------- envelopes */
  /* The envelope's action as the command route's {type, ...args}; throws a readable problem. */
  function toCommand(a) {
    const kind = a.action;
    const need = (cond, what) => { if (!cond) throw new Error(`${kind}: ${what}`); };
    switch (kind) {
      case "create_flow":
        need(isObject(a.flow) && isText(a.flow.id), "the flow (with an id) is missing");
        return { type: kind, flow: a.flow };
      case "update_flow": {
        need(isObject(a.flow), "the flow is missing");
        const id = a.flow_id || a.flow.id;
        need(isText(id), "the flow has no id");
        return { type: kind, flow_id: id, flow: a.flow };
      }
      case "delete_flow": case "start_flow": case "stop_flow": case "restart_flow":
        need(isText(a.flow_id), "flow_id is missing");
        return { type: kind, flow_id: a.flow_id };
      case "add_output":
        need(isText(a.flow_id), "flow_id is missing");
        need(isObject(a.output), "the output is missing");
        return { type: kind, flow_id: a.flow_id, output: a.output };
      case "remove_output":
        need(isText(a.flow_id) && isText(a.output_id), "flow_id and output_id are needed");
        return { type: kind, flow_id: a.flow_id, output_id: a.output_id };
      case "create_tunnel":
        need(isObject(a.tunnel), "the tunnel is missing");
        return { type: kind, tunnel: a.tunnel };
      case "delete_tunnel":
        need(isText(a.tunnel_id), "tunnel_id is missing");
        return { type: kind, tunnel_id: a.tunnel_id };
      default:
        throw new Error(`the assistant answered an action this page does not know: ${String(kind)}`);
    }
  }

  /* The envelope flattened to its commands (multiple → each in order); info → none. */
  function commandsOf(envelope) {
    if (!isObject(envelope)) throw new Error("the assistant's answer is not an action");
    if (envelope.action === "info") return [];
    if (envelope.action === "multiple") {
      if (!Array.isArray(envelope.actions) || !envelope.actions.length) throw new Error("multiple: no actions");
      return envelope.actions.flatMap((inner) => {
        if (isObject(inner) && inner.action === "multiple") throw new Error("multiple: nested multiple");
        return commandsOf(inner);
      });
    }
    return [toCommand(envelope)];
  }

  function flowLabel(flows, id) {
    const flow = flows.find((f) => f && f.id === id);
    return flow && flow.name ? `${id} (${flow.name})` : id;
  }

  /* Applies one command to a copy of the config, as the edge would; notes what cannot apply. */
  function simulate(config, command, notes) {
    const flows = Array.isArray(config.flows) ? config.flows : (config.flows = []);
    const findFlow = (id) => flows.findIndex((f) => f && f.id === id);
    switch (command.type) {
      case "create_flow":
        if (findFlow(command.flow.id) >= 0) notes.push(`A flow '${command.flow.id}' already exists on this node.`);
        flows.push(command.flow);
        break;
      case "update_flow": {
        const at = findFlow(command.flow_id);
        if (at < 0) notes.push(`No flow '${command.flow_id}' on this node to update.`);
        else flows[at] = command.flow;
        break;
      }
      case "delete_flow": {
        const at = findFlow(command.flow_id);
        if (at < 0) notes.push(`No flow '${command.flow_id}' on this node to delete.`);
        else flows.splice(at, 1);
        break;
      }
      case "add_output": {
        const at = findFlow(command.flow_id);
        if (at < 0) { notes.push(`No flow '${command.flow_id}' on this node.`); break; }
        const flow = flows[at];
        if (!Array.isArray(flow.outputs)) flow.outputs = [];
        flow.outputs.push(command.output);
        break;
      }
      case "remove_output": {
        const at = findFlow(command.flow_id);
        if (at < 0) { notes.push(`No flow '${command.flow_id}' on this node.`); break; }
        const outputs = Array.isArray(flows[at].outputs) ? flows[at].outputs : [];
        const index = outputs.findIndex((o) => o && o.id === command.output_id);
        if (index < 0) notes.push(`Flow '${command.flow_id}' has no output '${command.output_id}'.`);
        else outputs.splice(index, 1);
        break;
      }
      case "create_tunnel": {
        const tunnels = Array.isArray(config.tunnels) ? config.tunnels : (config.tunnels = []);
        tunnels.push(command.tunnel);
        break;
      }
      case "delete_tunnel": {
        const tunnels = Array.isArray(config.tunnels) ? config.tunnels : [];
        const index = tunnels.findIndex((t) => t && t.id === command.tunnel_id);
        if (index < 0) notes.push(`No tunnel '${command.tunnel_id}' on this node.`);
        else tunnels.splice(index, 1);
        break;
      }
      default:
        break;
    }
  }

  /* For the diff only: null keys dropped (unset either way), and the proposal's keys put in the
   * order of the current config's (matched by id in arrays), so only real changes show. */
  function withoutNulls(value) {
    if (Array.isArray(value)) return value.map(withoutNulls);
    if (!isObject(value)) return value;
    return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== null).map(([k, v]) => [k, withoutNulls(v)]));
  }

  function alignTo(after, before) {
    if (Array.isArray(after) && Array.isArray(before)) {
      return after.map((item, i) => {
        const twin = isObject(item) && item.id !== undefined ? before.find((b) => isObject(b) && b.id === item.id) : before[i];
        return alignTo(item, twin);
      });
    }
    if (!isObject(after) || !isObject(before)) return after;
    const out = {};
    for (const key of Object.keys(before)) if (key in after) out[key] = alignTo(after[key], before[key]);
    for (const key of Object.keys(after)) if (!(key in out)) out[key] = after[key];
    return out;
  }

  /* The diff with long unchanged runs folded to `context` lines around each change (a node with
   * many flows); MP.renderDiff draws the whole text. Same span classes as MP.renderDiff. */
  function renderCompactDiff(container, before, after, context) {
    const lines = MP.diffLines(before, after);
    const keep = lines.map(() => false);
    lines.forEach((d, i) => {
      if (d.op === "ctx") return;
      for (let j = Math.max(0, i - context); j <= Math.min(lines.length - 1, i + context); j++) keep[j] = true;
    });
    for (let i = 0; i < keep.length;) {  // a fold of one or two lines saves nothing: shown
      if (keep[i]) { i++; continue; }
      let j = i;
      while (j < keep.length && !keep[j]) j++;
      if (j - i <= 2) for (let k = i; k < j; k++) keep[k] = true;
      i = j;
    }
    const out = [];
    let folded = 0;
    const flush = () => {
      if (folded) out.push(el("span", { class: "gap" }, `  ⋯ ${folded} unchanged line${folded > 1 ? "s" : ""}`));
      folded = 0;
    };
    lines.forEach((d, i) => {
      if (!keep[i]) { folded++; return; }
      flush();
      out.push(el("span", { class: d.op }, (d.op === "add" ? "+ " : d.op === "del" ? "- " : "  ") + d.line));
    });
    flush();
    container.replaceChildren(...out);
  }

  function drawDiff() {
    if (!lastDiff) return;
    if ($("diff-whole").checked) MP.renderDiff($("proposal-diff"), lastDiff.before, lastDiff.after);
    else renderCompactDiff($("proposal-diff"), lastDiff.before, lastDiff.after, 3);
  }

  function describe(command, flows) {
    switch (command.type) {
      case "create_flow": return `Create flow ${command.flow.id}${command.flow.name ? ` (${command.flow.name})` : ""}`;
      case "update_flow": return `Replace the config of flow ${flowLabel(flows, command.flow_id)}`;
      case "delete_flow": return `Delete flow ${flowLabel(flows, command.flow_id)}`;
      case "add_output": return `Add output ${command.output.id || ""} to flow ${flowLabel(flows, command.flow_id)}`.replace("  ", " ");
      case "remove_output": return `Remove output ${command.output_id} from flow ${flowLabel(flows, command.flow_id)}`;
      case "create_tunnel": return `Create tunnel ${command.tunnel.id || command.tunnel.name || ""}`;
      case "delete_tunnel": return `Delete tunnel ${command.tunnel_id}`;
      default:
        if (RUN_ACTIONS[command.type]) return `${RUN_ACTIONS[command.type]} flow ${flowLabel(flows, command.flow_id)} (no config change)`;
        return command.type;
    }
  }

  /* ---------------------------------------------------------------- proposal */
  function setState(text, kind) {
    const badge = $("proposal-state");
    badge.textContent = text;
    badge.className = "badge" + (kind ? " " + kind : "");
    $("proposal").dataset.state = text.toLowerCase();
  }

  function setButtons(enabled) {
    $("proposal-apply").disabled = !enabled;
    $("proposal-discard").disabled = !enabled;
    $("proposal-buttons").hidden = !enabled;
  }

  async function showProposal(envelope, nodeId) {
    const node = nodes.find((n) => n.id === nodeId);
    proposal = { nodeId, nodeName: node ? node.name : "", commands: [] };
    $("proposal").hidden = false;
    $("proposal-message").textContent = isObject(envelope) && envelope.message ? String(envelope.message) : "";
    $("proposal-raw").textContent = JSON.stringify(envelope, null, 2);
    $("proposal-node").textContent = node ? `on ${node.name}` : "";
    $("apply-results").replaceChildren();
    $("diff-wrap").hidden = true;
    lastDiff = null;
    show($("proposal-warning"), "");
    $("proposal-steps").replaceChildren();

    let commands;
    try {
      commands = commandsOf(envelope);
    } catch (err) {
      setState("Not applicable", "sev-critical");
      setButtons(false);
      show($("proposal-warning"), "This proposal cannot be applied: " + err.message + ".");
      return;
    }
    if (!commands.length) {  // info: a message only
      setState("Info", "sev-info");
      setButtons(false);
      return;
    }
    proposal.commands = commands;
    if (!nodeId) {
      setState("Needs a node", "sev-warning");
      setButtons(false);
      show($("proposal-warning"), "Pick a node and ask again: a change is applied to one node.");
      return;
    }

    const answer = await api("GET", `/api/v1/nodes/${encodeURIComponent(nodeId)}/config`);
    const before = answer.ok && isObject(answer.data) ? answer.data : null;
    const flows = before && Array.isArray(before.flows) ? before.flows : [];
    $("proposal-steps").replaceChildren(...commands.map((c) => el("li", {}, describe(c, flows))));
    const notes = [];
    if (!before) {
      notes.push(`The node's current config could not be read (${answer.error}): no diff to show.`);
    } else {
      const after = structuredClone(before);
      for (const command of commands) simulate(after, command, notes);
      const sections = [];
      if (commands.some((c) => FLOW_ACTIONS.has(c.type))) sections.push("flows");
      if (commands.some((c) => TUNNEL_ACTIONS.has(c.type))) sections.push("tunnels");
      if (sections.length) {
        const pick = (cfg) => Object.fromEntries(sections.map((s) => [s, cfg[s] === undefined ? [] : cfg[s]]));
        const shownBefore = withoutNulls(pick(before));
        const beforeText = JSON.stringify(shownBefore, null, 2);
        const afterText = JSON.stringify(alignTo(withoutNulls(pick(after)), shownBefore), null, 2);
        lastDiff = { before: beforeText, after: afterText };
        drawDiff();
        const lines = MP.diffLines(beforeText, afterText);
        const added = lines.filter((d) => d.op === "add").length, removed = lines.filter((d) => d.op === "del").length;
        $("diff-stats").textContent = added || removed ? `+${added} −${removed} lines` : "no change in the config";
        $("diff-wrap").hidden = false;
      }
    }
    show($("proposal-warning"), notes.join(" "));
    setState("Not applied", "sev-warning");
    setButtons(true);
    $("proposal").scrollIntoView({ block: "start" });
    $("proposal-apply").focus({ preventScroll: true });
  }

  $("gen-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const prompt = $("gen-prompt").value.trim();
    if (!prompt) { show($("gen-error"), "Describe the change first."); $("gen-prompt").focus(); return; }
    const provider = $("gen-provider").value || "openai";
    const nodeId = $("gen-node").value;
    const body = { prompt, provider };
    if (nodeId) body.node_id = nodeId;
    show($("gen-error"), "");
    $("gen-submit").disabled = true;
    $("gen-busy").textContent = `Asking ${providerLabel(provider)}…`;
    const answer = await api("POST", "/api/v1/ai/generate-config", body);
    $("gen-submit").disabled = false;
    $("gen-busy").textContent = "";
    const data = answer.data;
    if (!answer.ok || !isObject(data) || data.success === false) {
      show($("gen-error"), (isObject(data) && data.error) || answer.error || "The assistant gave no answer.");
      return;
    }
    await showProposal(data.config, nodeId);
  });

  $("diff-whole").addEventListener("change", drawDiff);

  $("proposal-discard").addEventListener("click", () => {
    if (!proposal) return;
    proposal = null;
    setButtons(false);
    setState("Discarded", "");
    $("apply-results").replaceChildren(el("li", { class: "muted" }, "Discarded: nothing was sent to the node."));
    $("gen-prompt").focus();
  });

  $("proposal-apply").addEventListener("click", async () => {
    if (!proposal) return;
    const { nodeId, commands } = proposal;
    proposal = null;
    setButtons(false);
    setState("Applying…", "");
    const results = $("apply-results");
    results.replaceChildren();
    let failed = false;
    for (const [i, command] of commands.entries()) {
      const answer = await MP.command(nodeId, command);
      const ok = answer.ok && isObject(answer.data) && answer.data.success !== false;
      const label = `${i + 1}. ${command.type}`;
      results.append(el("li", { class: ok ? "ok" : "failed" }, ok ? `✓ ${label}: done` : `✗ ${label}: ${answer.error || (answer.data && answer.data.error) || "failed"}`));
      if (!ok) {
        failed = true;
        if (i + 1 < commands.length) results.append(el("li", { class: "muted" }, `${commands.length - i - 1} later step(s) not sent.`));
        break;
      }
    }
    if (failed) { setState("Failed", "sev-critical"); toast("The change was not fully applied", "error"); }
    else { setState("Applied", "sev-info"); toast("Change applied", "ok"); }
  });

  /* ---------------------------------------------------------------- ask */
  $("ask-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const query = $("ask-query").value.trim();
    if (!query) { show($("ask-error"), "Type a question first."); $("ask-query").focus(); return; }
    const provider = $("ask-provider").value || "openai";
    show($("ask-error"), "");
    $("ask-submit").disabled = true;
    $("ask-busy").textContent = `Asking ${providerLabel(provider)}…`;
    const answer = await api("POST", "/api/v1/ai/query", { query, provider });
    $("ask-submit").disabled = false;
    $("ask-busy").textContent = "";
    const data = answer.data;
    if (!answer.ok || !isObject(data) || data.success === false) {
      show($("ask-error"), (isObject(data) && data.error) || answer.error || "No answer.");
      $("ask-answer").hidden = true;
      return;
    }
    $("ask-answer").textContent = String(data.response ?? "");
    $("ask-answer").hidden = false;
  });

  fillProviderSelects();
  loadKeys();
  loadNodes();
})();
