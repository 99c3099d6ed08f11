// The schedule form's live preview: as the expression or zone changes, ask the operator API
// (GET /api/v1/ops/schedules/preview, the admin's own session) for the next fire times.
(function () {
  "use strict";
  function start() {
    var box = document.getElementById("schedule-preview");
    var cron = document.getElementById("id_cron");
    var zone = document.getElementById("id_timezone");
    if (!box || !cron || !zone) { return; }
    var timer = null;
    function show(lines, isError) {
      box.textContent = "";
      var list = document.createElement(isError ? "p" : "ol");
      lines.forEach(function (line) {
        var item = document.createElement(isError ? "span" : "li");
        item.textContent = line;
        list.appendChild(item);
      });
      if (isError) { list.className = "errornote"; }
      box.appendChild(list);
    }
    function refresh() {
      if (!cron.value.trim()) { show(["Type an expression to see its next fire times."], false); return; }
      var query = new URLSearchParams({ cron: cron.value, timezone: zone.value || "UTC", count: "5" });
      fetch(box.dataset.url + "?" + query.toString(), { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) { return response.json().then(function (body) { return [response.ok, body]; }); })
        .then(function (result) {
          var ok = result[0], body = result[1];
          if (ok) {
            var lines = body.fireTimes.length ? body.fireTimes : ["never fires within 50 years"];
            if (body.explanation) { lines = [body.explanation + ":"].concat(lines); }
            show(lines, false);
          } else {
            show([(body.field ? body.field + ": " : "") + (body.message || "invalid")], true);
          }
        })
        .catch(function () { show(["preview unavailable"], true); });
    }
    function later() { clearTimeout(timer); timer = setTimeout(refresh, 300); }
    cron.addEventListener("input", later);
    zone.addEventListener("change", later);
    refresh();
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
