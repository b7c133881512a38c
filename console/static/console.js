// The console's script: it reloads a page's live region while the page
// is visible, and selects every dead letter of a page at once. Pages work
// without it.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-refresh") || "0", 10);
  var pause = document.getElementById("pause-refresh");
  if (every > 0 && document.getElementById("live")) {
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden || (pause && pause.checked)) {
        return;
      }
      busy = true;
      fetch(location.href, { credentials: "same-origin", headers: { "X-Console-Refresh": "1" } })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          // Paused or hidden while the page was on its way: keep what is
          // shown, as a pause promises.
          if (document.hidden || (pause && pause.checked)) {
            return;
          }
          var doc = new DOMParser().parseFromString(html, "text/html");
          var next = doc.getElementById("live");
          var live = document.getElementById("live");
          if (next && live) {
            live.replaceWith(document.adoptNode(next));
          }
          var took = doc.querySelector("footer");
          var foot = document.querySelector("footer");
          if (took && foot) {
            foot.textContent = took.textContent;
          }
        })
        .catch(function () {})
        .then(function () { busy = false; });
    }, every * 1000);
  }
  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll("input.select").forEach(function (box) { box.checked = all.checked; });
    });
  }
})();
