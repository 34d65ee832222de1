// anarchon dashboard: countdowns, refresh without reloading, the explanation panel.
(function () {
  "use strict";
  var body = document.body;
  var skew = (Number(body.dataset.now) || Date.now()) - Date.now();
  var PARTIAL = { "X-Anarchon-Partial": "1" };

  function span(ms) {
    var s = Math.round(ms / 1000);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 172800) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d";
  }
  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var left = Number(el.dataset.countdown) - now;
      el.textContent = left > 0 ? "in " + span(left) : "due";
    });
  }
  tick();
  setInterval(tick, 1000);

  var every = Number(body.dataset.refresh) || 0;
  var busy = false;
  function typing() {
    var el = document.activeElement;
    return el && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName);
  }
  if (every > 0) {
    setInterval(function () {
      if (busy || document.hidden || typing()) return;
      busy = true;
      fetch(location.href, { headers: PARTIAL, credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html !== null && !typing()) {
            document.getElementById("content").innerHTML = html;
            tick();
          }
        })
        .catch(function () {})
        .then(function () { busy = false; });
    }, every);
  }

  var panel = document.getElementById("explain");
  document.addEventListener("click", function (event) {
    var link = event.target.closest("a[data-explain]");
    if (link && panel) {
      event.preventDefault();
      panel.hidden = false;
      var target = panel.querySelector(".body");
      target.textContent = "loading…";
      fetch(link.href, { headers: PARTIAL, credentials: "same-origin" })
        .then(function (r) { return r.text(); })
        .then(function (html) { target.innerHTML = html; })
        .catch(function (e) { target.textContent = "could not load: " + e; });
      return;
    }
    if (event.target.closest("#explain .close")) panel.hidden = true;
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && panel) panel.hidden = true;
  });
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
  });
})();
