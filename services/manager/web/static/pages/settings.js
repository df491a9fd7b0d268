/* The settings page (issue 21): the six runtime settings of interop.md 7.5 (GET/PUT
 * /api/v1/settings, only the changed keys sent), the TLS card (GET /api/v1/settings/tls, POST
 * /api/v1/settings/tls/upload) and the export (GET /api/v1/export as a JSON file). */
"use strict";

(function () {
  const { api, el, toast, fmt } = MP;
  const $ = (id) => document.getElementById(id);
  const MAX_PEM = 64 * 1024;

  /* interop.md 7.5: key, label, unit, range, what it drives. */
  const SETTINGS = [
    { key: "events_retention_days", label: "Event retention", unit: "days", min: 1, max: 365, help: "Events older than this are deleted by the daily cleanup." },
    { key: "ws_keepalive_interval_secs", label: "Node keepalive interval", unit: "s", min: 1, max: 300, help: "How often the manager pings each node." },
    { key: "session_lifetime_hours", label: "Session lifetime", unit: "hours", min: 1, max: 720, help: "How long a sign-in lasts (new sessions)." },
    { key: "max_login_attempts", label: "Login attempts", unit: "per IP per minute", min: 1, max: 100, help: "Sign-in attempts allowed from one address per 60 s." },
    { key: "node_offline_threshold_secs", label: "Node offline after", unit: "s", min: 5, max: 3600, help: "Silence after which a node is marked offline." },
    { key: "stats_broadcast_interval_ms", label: "Dashboard update interval", unit: "ms", min: 100, max: 60000, help: "The fastest pace of live dashboard updates." },
  ];

  let current = null;  // the server's last answer

  function show(box, text) { box.textContent = text || ""; box.hidden = !text; }

  /* ---------------------------------------------------------------- settings */
  function problemOf(spec, raw) {
    if (raw.trim() === "") return "required";
    if (!/^-?\d+$/.test(raw.trim())) return "a whole number";
    const value = Number(raw);
    if (value < spec.min || value > spec.max) return `must be ${spec.min}–${spec.max}`;
    return null;
  }

  function buildFields() {
    const box = $("settings-fields");
    box.replaceChildren(...SETTINGS.map((spec) => {
      const id = "set-" + spec.key;
      const input = el("input", {
        id, name: spec.key, type: "number", inputmode: "numeric", min: spec.min, max: spec.max, step: 1, required: true,
        "aria-describedby": `${id}-range ${id}-problem`,
      });
      input.addEventListener("input", refresh);
      return el("div", { class: "field setting", dataset: { key: spec.key } },
        el("label", { for: id }, spec.label, el("span", { class: "unit" }, ` (${spec.unit})`)),
        input,
        el("small", { class: "hint", id: `${id}-range` }, `${spec.min}–${spec.max} · ${spec.help}`),
        el("small", { class: "field-problem", id: `${id}-problem`, role: "alert" }),
        el("small", { class: "key mono" }, spec.key));
    }));
  }

  function fill(settings) {
    current = settings;
    for (const spec of SETTINGS) $("set-" + spec.key).value = settings[spec.key] ?? "";
    refresh();
  }

  /* Marks each field changed / out of range; the changed, valid keys, or null when one is out of range. */
  function refresh() {
    if (!current) return null;
    const changed = {};
    let bad = 0;
    for (const spec of SETTINGS) {
      const input = $("set-" + spec.key);
      const problem = problemOf(spec, input.value);
      const field = input.closest(".setting");
      field.querySelector(".field-problem").textContent = problem ? `${spec.label} ${problem}` : "";
      input.setAttribute("aria-invalid", problem ? "true" : "false");
      const dirty = !problem && Number(input.value) !== current[spec.key];
      field.dataset.dirty = String(dirty || Boolean(problem));
      if (problem) bad++;
      else if (dirty) changed[spec.key] = Number(input.value);
    }
    const count = Object.keys(changed).length;
    $("settings-save").disabled = bad > 0 || count === 0;
    $("settings-revert").disabled = bad === 0 && count === 0;
    $("settings-dirty").textContent = bad ? `${bad} value${bad > 1 ? "s" : ""} out of range` : count ? `${count} unsaved change${count > 1 ? "s" : ""}` : "";
    return bad ? null : changed;
  }

  async function loadSettings() {
    const answer = await api("GET", "/api/v1/settings");
    if (!answer.ok) { show($("settings-error"), "Settings could not be read: " + answer.error); return; }
    show($("settings-error"), "");
    fill(answer.data);
  }

  $("settings-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    show($("settings-ok"), "");
    const changed = refresh();
    if (changed === null) {
      show($("settings-error"), "Some values are out of range: nothing was sent.");
      const invalid = document.querySelector("#settings-fields input[aria-invalid='true']");
      if (invalid) invalid.focus();
      return;
    }
    if (!Object.keys(changed).length) { show($("settings-error"), "Nothing changed."); return; }
    $("settings-save").disabled = true;
    const answer = await api("PUT", "/api/v1/settings", { settings: changed });
    if (!answer.ok) {
      show($("settings-error"), "Not saved: " + answer.error);
      refresh();
      return;
    }
    show($("settings-error"), "");
    fill(answer.data);
    const names = Object.keys(changed).map((key) => SETTINGS.find((s) => s.key === key).label.toLowerCase());
    show($("settings-ok"), `Saved: ${names.join(", ")}.`);
    toast("Settings saved", "ok");
  });

  $("settings-revert").addEventListener("click", () => {
    if (current) fill(current);
    show($("settings-error"), "");
    show($("settings-ok"), "");
  });

  /* ---------------------------------------------------------------- TLS */
  function row(label, value, cls) {
    return [el("dt", {}, label), el("dd", { class: cls || "" }, value)];
  }

  async function loadTls() {
    const answer = await api("GET", "/api/v1/settings/tls");
    const info = $("tls-info");
    if (!answer.ok) {
      info.replaceChildren(...row("Certificate", answer.status === 404 ? "Not served by the manager (behind a proxy)." : "–", "muted"));
      if (answer.status !== 404) show($("tls-error"), "The certificate could not be read: " + answer.error);
      return;
    }
    show($("tls-error"), "");
    const tls = answer.data;
    const now = new Date();
    const notAfter = new Date(tls.not_after);
    const daysLeft = Math.floor((notAfter - now) / 86400000);
    const validity = el("span", {}, `${fmt.time(tls.not_before)} → ${fmt.time(tls.not_after)} `,
      el("span", { class: daysLeft < 0 ? "sev-critical" : daysLeft < 30 ? "sev-warning" : "muted" },
        daysLeft < 0 ? "(expired)" : `(${daysLeft} days left)`));
    info.replaceChildren(
      ...row("Subject", tls.subject, "mono"),
      ...row("Issuer", tls.issuer, "mono"),
      ...row("Self-signed", el("span", { id: "tls-self-signed", class: "badge " + (tls.self_signed ? "sev-warning" : "sev-info"), dataset: { value: String(tls.self_signed) } },
        tls.self_signed ? "yes: browsers warn, nodes pin the fingerprint" : "no")),
      ...row("Valid", validity),
      ...row("SHA-256 fingerprint", el("code", { id: "tls-fingerprint", class: "fingerprint" }, tls.fingerprint_sha256)));
  }

  function readFile(input, target) {
    input.addEventListener("change", () => {
      const file = input.files && input.files[0];
      if (!file) return;
      if (file.size > MAX_PEM) { show($("tls-upload-error"), `${file.name} is larger than 64 KiB.`); input.value = ""; return; }
      const reader = new FileReader();
      reader.onload = () => { target.value = String(reader.result); show($("tls-upload-error"), ""); };
      reader.onerror = () => show($("tls-upload-error"), `${file.name} could not be read.`);
      reader.readAsText(file);
    });
  }
  readFile($("tls-cert-file"), $("tls-cert"));
  readFile($("tls-key-file"), $("tls-key"));

  $("tls-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    show($("tls-upload-ok"), "");
    const cert = $("tls-cert").value, key = $("tls-key").value;
    const size = (text) => new TextEncoder().encode(text).length;
    const problems = [];
    if (!cert.includes("-----BEGIN")) problems.push("Paste the certificate PEM.");
    if (!key.includes("-----BEGIN")) problems.push("Paste the private key PEM.");
    if (size(cert) > MAX_PEM) problems.push("The certificate is larger than 64 KiB.");
    if (size(key) > MAX_PEM) problems.push("The key is larger than 64 KiB.");
    if (problems.length) { show($("tls-upload-error"), problems.join(" ")); return; }
    $("tls-upload").disabled = true;
    const answer = await api("POST", "/api/v1/settings/tls/upload", { cert_pem: cert, key_pem: key });
    $("tls-upload").disabled = false;
    if (!answer.ok || !answer.data || answer.data.success === false) {
      show($("tls-upload-error"), "Not uploaded: " + (answer.error || (answer.data && answer.data.error) || "HTTP " + answer.status));
      return;
    }
    show($("tls-upload-error"), "");
    show($("tls-upload-ok"), answer.data.message || "Uploaded.");
    $("tls-key").value = "";
    $("tls-key-file").value = "";
    toast("Certificate saved: restart the manager to serve it", "ok");
  });

  /* ---------------------------------------------------------------- export */
  let exportUrl = null;
  $("export-button").addEventListener("click", async () => {
    $("export-button").disabled = true;
    const answer = await api("GET", "/api/v1/export");
    $("export-button").disabled = false;
    if (!answer.ok) { toast("Export failed: " + answer.error, "error"); return; }
    if (exportUrl) URL.revokeObjectURL(exportUrl);
    exportUrl = URL.createObjectURL(new Blob([JSON.stringify(answer.data, null, 2) + "\n"], { type: "application/json" }));
    const stamp = new Date().toISOString().slice(0, 19).replace(/[:T]/g, "-");
    const link = $("export-link");
    link.href = exportUrl;
    link.download = `mediaplane-manager-export-${stamp}.json`;
    link.hidden = false;
    link.click();
    toast("Export downloaded (no passwords, secrets or AI keys)", "ok");
  });

  buildFields();
  loadSettings();
  loadTls();
})();
