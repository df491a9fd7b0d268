/* The users page (issue 21): the users of GET /api/v1/users, a create form, an edit dialog and
 * a delete confirmation, all through /api/v1/users (interop.md 7.1, 13). An admin who is not a
 * super_admin sees super_admin rows read-only and is not offered that role; the server refuses
 * anyway. */
"use strict";

(function () {
  const { api, el, toast, fmt } = MP;
  const IS_SUPER = document.body.dataset.super === "true";
  const ME = document.body.dataset.username;
  const USERNAME = /^[A-Za-z0-9_.-]{1,64}$/;
  const RULES = [
    ["8–128 characters", (p) => p.length >= 8 && p.length <= 128],
    ["an upper-case letter", (p) => /\p{Lu}/u.test(p)],
    ["a lower-case letter", (p) => /\p{Ll}/u.test(p)],
    ["a digit", (p) => /\p{Nd}/u.test(p)],
  ];

  const $ = (id) => document.getElementById(id);
  let users = [];
  let nodes = [];
  let editing = null;
  let deleting = null;

  /* ---------------------------------------------------------------- helpers */
  function showError(box, text) {
    box.textContent = text || "";
    box.hidden = !text;
  }

  function errorText(answer) {
    if (answer.status === 409) return "That username is taken: " + answer.error;
    if (answer.status === 403) return "Not allowed: " + answer.error;
    return answer.error || "HTTP " + answer.status;
  }

  function passwordProblems(password) {
    return RULES.filter(([, ok]) => !ok(password)).map(([label]) => label);
  }

  /* The rule list under a password input, each item ticked as it is met. */
  function bindRules(input, list, optional) {
    const items = RULES.map(([label]) => el("li", { "data-met": "false" }, label));
    list.replaceChildren(el("li", { class: "rules-head" }, optional ? "If set, at least:" : "At least:"), ...items);
    function update() {
      const value = input.value;
      RULES.forEach(([, ok], i) => { items[i].dataset.met = String(ok(value)); });
    }
    input.addEventListener("input", update);
    update();
    return update;
  }

  function nodeName(id) {
    const node = nodes.find((n) => n.id === id);
    return node ? node.name : id.slice(0, 8) + "…";
  }

  function fillNodeSelect(select, chosen) {
    const wanted = new Set(chosen || []);
    select.replaceChildren(...nodes.map((n) =>
      el("option", { value: n.id, selected: wanted.has(n.id) }, `${n.name} (${n.device_type})`)));
    for (const id of wanted) {  // a node since deleted stays visible, and selected
      if (!nodes.some((n) => n.id === id)) select.append(el("option", { value: id, selected: true }, id));
    }
  }

  function scopeOf(name) {
    const checked = document.querySelector(`input[name="${name}"]:checked`);
    return checked ? checked.value : "all";
  }

  function bindScope(name, select) {
    const sync = () => { select.disabled = scopeOf(name) !== "some"; };
    for (const radio of document.querySelectorAll(`input[name="${name}"]`)) radio.addEventListener("change", sync);
    return sync;
  }

  function chosenNodes(name, select) {
    if (scopeOf(name) === "all") return { value: null };
    const ids = [...select.selectedOptions].map((o) => o.value);
    if (!ids.length) return { problem: "Pick at least one node, or choose All nodes." };
    return { value: ids };
  }

  /* ---------------------------------------------------------------- table */
  function statusCell(user) {
    const parts = [];
    parts.push(user.is_active ? el("span", { class: "state-online dot" }, "Active") : el("span", { class: "state-offline dot" }, "Disabled"));
    if (user.is_temporary) {
      const expired = user.expires_at && new Date(user.expires_at) < new Date();
      parts.push(el("div", { class: expired ? "sev-critical small" : "sev-warning small" },
        (expired ? "Expired " : "Temporary, until ") + fmt.time(user.expires_at)));
    }
    return el("td", {}, parts);
  }

  function nodesCell(user) {
    if (user.allowed_node_ids === null || user.allowed_node_ids === undefined) return el("td", { class: "muted" }, "All nodes");
    if (!user.allowed_node_ids.length) return el("td", { class: "muted" }, "None");
    return el("td", {}, el("ul", { class: "chips" }, user.allowed_node_ids.map((id) => el("li", { class: "chip" }, nodeName(id)))));
  }

  function actionsCell(user) {
    if (user.role === "super_admin" && !IS_SUPER) {
      return el("td", { class: "actions muted" }, el("span", { title: "Only a super_admin may change a super_admin" }, "read-only"));
    }
    const label = user.username;
    return el("td", { class: "actions" },
      el("button", { type: "button", class: "btn btn-small", "aria-label": `Edit ${label}`, dataset: { edit: user.id }, onclick: () => openEdit(user) }, "Edit"),
      user.username === ME ? null :
        el("button", { type: "button", class: "btn btn-small btn-danger", "aria-label": `Delete ${label}`, dataset: { delete: user.id }, onclick: () => openDelete(user) }, "Delete"));
  }

  function render() {
    const body = $("users-body");
    $("users-count").textContent = `${users.length} user${users.length === 1 ? "" : "s"}`;
    if (!users.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No users.")));
      return;
    }
    body.replaceChildren(...users.map((user) => el("tr", { dataset: { user: user.username }, class: user.is_active ? "" : "inactive" },
      el("td", {},
        el("div", { class: "uname mono" }, user.username, user.username === ME ? el("span", { class: "muted you" }, " (you)") : null),
        user.display_name ? el("div", { class: "muted small" }, user.display_name) : null),
      el("td", {}, user.email || el("span", { class: "muted" }, "–")),
      el("td", {}, el("span", { class: `badge role-badge role-${user.role}` }, user.role)),
      statusCell(user),
      nodesCell(user),
      el("td", { class: "nowrap" }, user.last_login_at ? fmt.time(user.last_login_at) : el("span", { class: "muted" }, "never")),
      actionsCell(user))));
  }

  async function load() {
    const [usersAnswer, nodesAnswer] = await Promise.all([api("GET", "/api/v1/users"), api("GET", "/api/v1/nodes")]);
    if (nodesAnswer.ok && Array.isArray(nodesAnswer.data)) {
      nodes = nodesAnswer.data;
      const keep = [...$("new-nodes").selectedOptions].map((o) => o.value);
      fillNodeSelect($("new-nodes"), keep);
    } else {
      toast("Nodes could not be read: " + errorText(nodesAnswer), "error");
    }
    if (!usersAnswer.ok) {
      showError($("users-error"), "Users could not be read: " + errorText(usersAnswer));
      return;
    }
    showError($("users-error"), "");
    users = usersAnswer.data || [];
    render();
  }

  /* ---------------------------------------------------------------- create */
  const createForm = $("create-form");
  const createError = $("create-error");
  const updateNewRules = bindRules($("new-password"), $("new-password-rules"), false);
  const syncNewScope = bindScope("new-scope", $("new-nodes"));
  $("new-temporary").addEventListener("change", () => { $("new-expires").disabled = !$("new-temporary").checked; });

  createForm.addEventListener("reset", () => {
    setTimeout(() => {
      showError(createError, "");
      updateNewRules();
      syncNewScope();
      $("new-expires").disabled = true;
    });
  });

  createForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const username = $("new-username").value.trim();
    const password = $("new-password").value;
    const problems = [];
    if (!USERNAME.test(username)) problems.push("The username must be 1–64 characters of A–Z, a–z, 0–9, '_', '.' and '-'.");
    const missing = passwordProblems(password);
    if (missing.length) problems.push("The password needs " + missing.join(", ") + ".");
    const scope = chosenNodes("new-scope", $("new-nodes"));
    if (scope.problem) problems.push(scope.problem);
    const body = { username, password, role: $("new-role").value, allowed_node_ids: scope.value };
    const display = $("new-display").value.trim();
    const email = $("new-email").value.trim();
    if (display) body.display_name = display;
    if (email) body.email = email;
    if ($("new-temporary").checked) {
      const when = $("new-expires").value ? new Date($("new-expires").value) : null;
      if (!when || isNaN(when)) problems.push("A temporary account needs an expiry time.");
      else if (when <= new Date()) problems.push("The expiry time must be in the future.");
      else { body.is_temporary = true; body.expires_at = when.toISOString(); }
    }
    if (problems.length) {
      showError(createError, problems.join(" "));
      (missing.length ? $("new-password") : $("new-username")).focus();
      return;
    }
    showError(createError, "");
    const button = $("create-submit");
    button.disabled = true;
    const answer = await api("POST", "/api/v1/users", body);
    button.disabled = false;
    if (!answer.ok) {
      showError(createError, errorText(answer));
      return;
    }
    toast(`User ${answer.data.username} created`, "ok");
    createForm.reset();
    await load();
  });

  /* ---------------------------------------------------------------- edit */
  const editDialog = $("edit-dialog");
  const editError = $("edit-error");
  const updateEditRules = bindRules($("edit-password"), $("edit-password-rules"), true);
  const syncEditScope = bindScope("edit-scope", $("edit-nodes"));

  function openEdit(user) {
    editing = user;
    $("edit-title").textContent = `Edit ${user.username}`;
    $("edit-role").value = user.role;
    $("edit-display").value = user.display_name || "";
    $("edit-email").value = user.email || "";
    const all = user.allowed_node_ids === null || user.allowed_node_ids === undefined;
    document.querySelector(`input[name="edit-scope"][value="${all ? "all" : "some"}"]`).checked = true;
    fillNodeSelect($("edit-nodes"), all ? [] : user.allowed_node_ids);
    syncEditScope();
    $("edit-active").checked = user.is_active;
    $("edit-active").disabled = user.username === ME;
    $("edit-password").value = "";
    updateEditRules();
    showError(editError, "");
    editDialog.showModal();
    $("edit-role").focus();
  }

  function sameIds(a, b) {
    if (a === null || b === null) return a === b;
    return a.length === b.length && [...a].sort().join() === [...b].sort().join();
  }

  $("edit-cancel").addEventListener("click", () => editDialog.close());
  $("edit-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!editing) return;
    const user = editing;
    const changes = {};
    if ($("edit-role").value !== user.role) changes.role = $("edit-role").value;
    const display = $("edit-display").value.trim() || null;
    if (display !== (user.display_name || null)) changes.display_name = display;
    const email = $("edit-email").value.trim() || null;
    if (email !== (user.email || null)) changes.email = email;
    const scope = chosenNodes("edit-scope", $("edit-nodes"));
    if (scope.problem) { showError(editError, scope.problem); return; }
    if (!sameIds(scope.value, user.allowed_node_ids === undefined ? null : user.allowed_node_ids)) changes.allowed_node_ids = scope.value;
    if ($("edit-active").checked !== user.is_active) changes.is_active = $("edit-active").checked;
    const password = $("edit-password").value;
    if (password) {
      const missing = passwordProblems(password);
      if (missing.length) { showError(editError, "The password needs " + missing.join(", ") + "."); $("edit-password").focus(); return; }
      changes.password = password;
    }
    if (!Object.keys(changes).length) { showError(editError, "Nothing changed."); return; }
    $("edit-save").disabled = true;
    const answer = await api("PUT", `/api/v1/users/${encodeURIComponent(user.id)}`, changes);
    $("edit-save").disabled = false;
    if (!answer.ok) { showError(editError, errorText(answer)); return; }
    editDialog.close();
    toast(`User ${user.username} saved`, "ok");
    await load();
  });

  /* ---------------------------------------------------------------- delete */
  const deleteDialog = $("delete-dialog");
  function openDelete(user) {
    deleting = user;
    $("delete-name").textContent = user.username;
    showError($("delete-error"), "");
    deleteDialog.showModal();
    $("delete-cancel").focus();
  }
  $("delete-cancel").addEventListener("click", () => deleteDialog.close());
  $("delete-confirm").addEventListener("click", async () => {
    if (!deleting) return;
    const user = deleting;
    $("delete-confirm").disabled = true;
    const answer = await api("DELETE", `/api/v1/users/${encodeURIComponent(user.id)}`);
    $("delete-confirm").disabled = false;
    if (!answer.ok) { showError($("delete-error"), errorText(answer)); return; }
    deleteDialog.close();
    toast(`User ${user.username} deleted`, "ok");
    await load();
  });

  $("users-reload").addEventListener("click", load);
  load();
})();
