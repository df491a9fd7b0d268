// The status page's live updates: one WebSocket, plain JavaScript, no library.
// Each message is {system: html, flows: [[id, html], ...], thumbs: {id: dataURL|null}};
// the server renders the HTML, this only puts it in place (keeping each flow's picture).
// The "watch" button plays a flow inline over WHEP (RFC 9725) from POST /watch/<flow_id>:
// its player sits outside the card's live part, and the button node is kept across
// updates, so neither is replaced by the next message.
"use strict";
(function () {
  const main = document.getElementById("flows");
  const system = document.getElementById("system");
  const conn = document.getElementById("conn");
  let delay = 1000;
  const GATHER_MS = 3000; // bound on ICE gathering before the (non-trickle) offer is sent
  const watching = new Map(); // flow id -> {pc, location, box, video, msg, closed}

  function setConn(state, text) {
    conn.dataset.state = state;
    conn.textContent = text;
  }

  function card(id) {
    const found = document.getElementById("flow-" + id);
    if (found) return found;
    const article = document.createElement("article");
    article.className = "flow";
    article.id = "flow-" + id;
    article.dataset.flow = id;
    const figure = document.createElement("figure");
    figure.className = "thumb";
    const img = document.createElement("img");
    img.alt = "picture of flow " + id;
    img.dataset.thumb = id;
    img.hidden = true;
    const caption = document.createElement("figcaption");
    caption.className = "nopic";
    caption.textContent = "no picture";
    figure.append(img, caption);
    const live = document.createElement("div");
    live.className = "live";
    article.append(figure, live);
    return article;
  }

  function apply(msg) {
    system.innerHTML = msg.system;
    const keep = new Set();
    let before = null;
    for (let i = msg.flows.length - 1; i >= 0; i--) {
      const [id, html] = msg.flows[i];
      const el = card(id);
      const live = el.querySelector(".live");
      const button = live.querySelector("button[data-watch]");
      live.innerHTML = html;
      keepButton(id, live, button);
      if (el.parentNode !== main || el.nextElementSibling !== before) main.insertBefore(el, before);
      before = el;
      keep.add(el);
    }
    for (const el of Array.from(main.children)) {
      if (!keep.has(el)) el.remove();
    }
    for (const [id, session] of Array.from(watching)) {
      if (!document.getElementById("flow-" + id)) stopWatch(id, session); // the flow is gone
    }
    if (msg.flows.length === 0) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "No flows are configured.";
      main.append(p);
    }
    for (const [id, url] of Object.entries(msg.thumbs || {})) {
      const el = document.getElementById("flow-" + id);
      if (!el) continue;
      const img = el.querySelector("img[data-thumb]");
      const caption = el.querySelector(".nopic");
      if (url) {
        img.src = url;
        img.hidden = false;
        caption.hidden = true;
      } else {
        img.removeAttribute("src");
        img.hidden = true;
        caption.hidden = false;
      }
    }
  }

  // ---------------------------------------------------------------- watch (WHEP)

  // The button as rendered now (enabled only while the flow runs) replaced by the one on
  // the page, so that a click in progress, the focus and "stop" survive the update.
  function keepButton(id, live, old) {
    const fresh = live.querySelector("button[data-watch]");
    if (!old || !fresh) return;
    old.title = fresh.title;
    old.dataset.off = fresh.disabled ? "1" : "0";
    fresh.replaceWith(old);
    showButton(id, old);
  }

  function showButton(id, button) {
    const on = watching.has(id);
    button.textContent = on ? "stop" : "watch";
    button.classList.toggle("on", on);
    button.disabled = !on && button.dataset.off === "1";
  }

  function buttonOf(id) {
    const el = document.getElementById("flow-" + id);
    return el && el.querySelector("button[data-watch]");
  }

  function say(session, text, bad) {
    session.msg.textContent = text;
    session.msg.classList.toggle("bad", !!bad);
  }

  function gathered(pc) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise(function (resolve) {
      const timer = setTimeout(done, GATHER_MS);
      function done() {
        clearTimeout(timer);
        pc.removeEventListener("icegatheringstatechange", check);
        resolve();
      }
      function check() {
        if (pc.iceGatheringState === "complete") done();
      }
      pc.addEventListener("icegatheringstatechange", check);
    });
  }

  async function refusal(response) {
    let text = "";
    try {
      text = (await response.json()).error || "";
    } catch (e) {
      text = "";
    }
    if (response.status === 409) return "flow not running";
    if (response.status === 404) return "flow not found";
    if (response.status === 503 && response.headers.get("Retry-After")) return "viewer limit reached, try again later";
    return text || "watch refused (HTTP " + response.status + ")";
  }

  function hangUp(session) {
    session.closed = true;
    if (session.location) {
      fetch(session.location, { method: "DELETE", keepalive: true }).catch(function () {});
      session.location = null;
    }
    if (session.pc) session.pc.close();
    session.video.srcObject = null;
    session.box.removeAttribute("data-location");
  }

  // Stop watching; with `error`, keep the message in the card (the player itself goes).
  function stopWatch(id, session, error) {
    if (watching.get(id) === session) watching.delete(id);
    hangUp(session);
    if (error) {
      session.video.hidden = true;
      say(session, error, true);
    } else {
      session.box.remove();
    }
    const button = buttonOf(id);
    if (button) showButton(id, button);
  }

  async function startWatch(id) {
    const article = document.getElementById("flow-" + id);
    if (!article) return;
    let box = article.querySelector(".player");
    if (!box) {
      box = document.createElement("div");
      box.className = "player";
      article.append(box);
    }
    const video = document.createElement("video");
    video.muted = true;
    video.autoplay = true;
    video.playsInline = true;
    video.controls = true;
    video.dataset.watch = id;
    const msg = document.createElement("p");
    msg.className = "watch-msg";
    msg.setAttribute("role", "status");
    box.replaceChildren(video, msg);
    const session = { pc: null, location: null, box: box, video: video, msg: msg, closed: false };
    watching.set(id, session);
    const button = buttonOf(id);
    if (button) showButton(id, button);
    say(session, "connecting…");
    video.addEventListener("playing", function () {
      if (!session.closed) say(session, "");
    });
    try {
      const pc = new RTCPeerConnection({ iceServers: [] });
      session.pc = pc;
      pc.addTransceiver("video", { direction: "recvonly" });
      pc.addTransceiver("audio", { direction: "recvonly" });
      const stream = new MediaStream();
      pc.ontrack = function (event) {
        stream.addTrack(event.track);
        video.srcObject = stream;
      };
      pc.onconnectionstatechange = function () {
        if (session.closed) return;
        if (pc.connectionState === "failed") stopWatch(id, session, "connection lost");
        else if (pc.connectionState === "disconnected") say(session, "connection interrupted…");
        else if (pc.connectionState === "connected" && !video.paused) say(session, "");
      };
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      if (session.closed) return;
      const response = await fetch("/watch/" + encodeURIComponent(id), {
        method: "POST",
        headers: { "Content-Type": "application/sdp" },
        body: pc.localDescription.sdp,
      });
      if (response.status !== 201) {
        if (!session.closed) stopWatch(id, session, await refusal(response));
        return;
      }
      session.location = response.headers.get("Location");
      const answer = await response.text();
      if (session.closed) {
        hangUp(session); // stopped while the offer was on its way: end the new session too
        return;
      }
      box.dataset.location = session.location || "";
      await pc.setRemoteDescription({ type: "answer", sdp: answer });
    } catch (err) {
      if (!session.closed) stopWatch(id, session, "cannot play: " + (err && err.message ? err.message : err));
    }
  }

  main.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-watch]");
    if (!button || button.disabled) return;
    const id = button.dataset.watch;
    const session = watching.get(id);
    if (session) stopWatch(id, session);
    else startWatch(id);
  });

  window.addEventListener("pagehide", function () {
    for (const session of watching.values()) hangUp(session);
  });

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + location.host + "/ws");
    ws.onopen = function () {
      delay = 1000;
      setConn("live", "live");
    };
    ws.onmessage = function (event) {
      apply(JSON.parse(event.data));
    };
    ws.onclose = function () {
      setConn("off", "reconnecting…");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    };
  }

  connect();
})();
