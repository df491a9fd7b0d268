// The status page's live updates: one WebSocket, plain JavaScript, no library.
// Each message is {system: html, flows: [[id, html], ...], thumbs: {id: dataURL|null}};
// the server renders the HTML, this only puts it in place (keeping each flow's picture).
"use strict";
(function () {
  const main = document.getElementById("flows");
  const system = document.getElementById("system");
  const conn = document.getElementById("conn");
  let delay = 1000;

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
      el.querySelector(".live").innerHTML = html;
      if (el.parentNode !== main || el.nextElementSibling !== before) main.insertBefore(el, before);
      before = el;
      keep.add(el);
    }
    for (const el of Array.from(main.children)) {
      if (!keep.has(el)) el.remove();
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
