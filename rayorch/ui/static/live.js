// Live pages: re-fetch this page every two seconds and swap in its #live element, until
// the page says the run is over (data-live="false"). No value from the store is read
// here; the server escaped the HTML, and parsed HTML never runs scripts.
(function () {
  "use strict";
  var EVERY_MS = 2000;
  var state = document.getElementById("poll-state");
  function say(text) { if (state) { state.textContent = text; } }
  function current() { return document.getElementById("live"); }
  function tick() {
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        var old = current();
        if (fresh && old) { old.replaceWith(document.importNode(fresh, true)); }
        var live = current();
        if (live && live.getAttribute("data-live") === "true") {
          say("live, updated " + new Date().toLocaleTimeString());
          window.setTimeout(tick, EVERY_MS);
        } else {
          say("finished");
        }
      })
      .catch(function (err) {
        say("update failed (" + err.message + "), retrying");
        window.setTimeout(tick, EVERY_MS * 2);
      });
  }
  var live = current();
  if (live && live.getAttribute("data-live") === "true") {
    say("live");
    window.setTimeout(tick, EVERY_MS);
  }
})();
