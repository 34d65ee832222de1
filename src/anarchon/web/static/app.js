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
  var asked = 0;
  var lastFresh = Date.now();
  var stale = null;
  function typing() {
    var el = document.activeElement;
    return el && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName);
  }
  function utc(ms) {
    return new Date(ms).toISOString().slice(11, 19) + "Z";
  }
  // A refresh that fails leaves the figures as they were: say so above them, or they read as
  // current (a backend down answers 503; a dashboard gone answers nothing).
  function markStale(why) {
    var content = document.getElementById("content");
    if (!stale) {
      stale = document.createElement("p");
      stale.className = "banner error";
      stale.setAttribute("role", "alert");
      stale.dataset.stale = "";
      content.parentNode.insertBefore(stale, content);
    }
    stale.textContent = "Not refreshed since " + utc(lastFresh) + " (" + span(Date.now() - lastFresh) +
      " ago): " + why + ". What the page shows may be out of date.";
  }
  function markFresh() {
    lastFresh = Date.now();
    if (stale) {
      stale.remove();
      stale = null;
    }
  }
  function reason(status, html) {
    var text = new DOMParser().parseFromString(html, "text/html").body.textContent || "";
    text = text.replace(/\s+/g, " ").trim().slice(0, 300);
    return "the dashboard answered " + status + (text ? " (" + text + ")" : "");
  }
  // What the reader opened (a traceback's <details>) stays open across a refresh.
  function openKeys(root) {
    return Array.from(root.querySelectorAll("details[open]")).map(function (el) {
      var row = el.closest("[data-run]");
      return row ? row.dataset.run : null;
    }).filter(function (key) { return key !== null; });
  }
  function reopen(root, keys) {
    keys.forEach(function (key) {
      root.querySelectorAll("[data-run]").forEach(function (row) {
        if (row.dataset.run === key) {
          row.querySelectorAll("details").forEach(function (el) { el.open = true; });
        }
      });
    });
  }
  if (every > 0) {
    setInterval(function () {
      if (busy) {
        if (Date.now() - asked > Math.max(3 * every, 15000)) {
          markStale("no answer from the dashboard for " + span(Date.now() - asked));
        }
        return;
      }
      if (document.hidden || typing()) return;
      busy = true;
      asked = Date.now();
      fetch(location.href, { headers: PARTIAL, credentials: "same-origin" })
        .then(function (r) {
          return r.text().then(function (html) { return { ok: r.ok, status: r.status, html: html }; });
        })
        .then(function (reply) {
          if (!reply.ok) {
            markStale(reason(reply.status, reply.html));
          } else if (!typing()) {
            var content = document.getElementById("content");
            var keys = openKeys(content);
            content.innerHTML = reply.html;
            reopen(content, keys);
            markFresh();
            tick();
          }
        })
        .catch(function (e) { markStale("no answer from the dashboard (" + e + ")"); })
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
