/* The sign-in page: POST /api/v1/auth/login (interop.md 7.1), then on to `next` (a path on this
 * manager only). Every refusal is shown: wrong credentials, and the rate limit with its wait. */
"use strict";

(function () {
  const form = document.getElementById("login-form");
  const errorBox = document.getElementById("login-error");
  const submit = document.getElementById("login-submit");
  let countdown = null;

  function target() {
    const next = new URLSearchParams(location.search).get("next") || "/fleet";
    // Only a path of this origin: never "//host" or "https://…" (an open redirect).
    return /^\/(?![\/\\])/.test(next) && !next.startsWith("/login") ? next : "/fleet";
  }

  function showError(text) {
    errorBox.textContent = text;
    errorBox.hidden = false;
  }

  function rateLimited(seconds) {
    let left = seconds;
    submit.disabled = true;
    const tick = () => {
      if (left <= 0) {
        clearInterval(countdown);
        countdown = null;
        submit.disabled = false;
        showError("You can try again now.");
        return;
      }
      showError(`Too many sign-in attempts from this address. The limit is per minute: try again in ${left} s.`);
      left -= 1;
    };
    tick();
    countdown = setInterval(tick, 1000);
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (countdown) return;
    const username = form.username.value.trim();
    const password = form.password.value;
    if (!username || !password) {
      showError("Enter a username and a password.");
      return;
    }
    submit.disabled = true;
    errorBox.hidden = true;
    const answer = await MP.api("POST", "/api/v1/auth/login", { username, password }, { noRedirect: true });
    submit.disabled = false;
    if (answer.ok && answer.data && answer.data.success) {
      location.assign(target());
      return;
    }
    form.password.value = "";
    form.password.focus();
    if (answer.status === 429) {
      rateLimited(Number(answer.headers.get("Retry-After")) || 60);
    } else if (answer.status === 401 || answer.status === 400) {
      showError("Wrong username or password, or the account is disabled or expired.");
    } else {
      showError(answer.error || "Sign-in failed.");
    }
  });
})();
