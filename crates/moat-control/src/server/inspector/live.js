// The Inspector's only script: live events on a run page, countdowns on the
// runners page. Pages work without it (they are rendered on the server).
(function () {
  const list = document.getElementById("events");
  if (list && list.dataset.stream) {
    const url = list.dataset.stream + "?after=" + (list.dataset.last || "0");
    const source = new EventSource(url);
    source.onmessage = function (message) {
      let event;
      try { event = JSON.parse(message.data); } catch (e) { return; }
      const item = document.createElement("li");
      item.className = "event fresh";
      item.dataset.type = event.type;
      item.dataset.seq = message.lastEventId;
      const what = [event.at, event.type, event.opId ? "op " + event.opId : "",
        event.data && event.data.reason ? "reason " + event.data.reason : "",
        event.data && !event.data.reason && event.data.message ? "reason " + event.data.message : ""];
      item.textContent = what.filter(Boolean).join("  ");
      list.appendChild(item);
      list.scrollTop = list.scrollHeight;
    };
    // The server says when the run has ended and every event is sent: stop
    // there, instead of reconnecting to a finished run forever.
    source.addEventListener("end", function () { source.close(); });
  }
  const clocks = document.querySelectorAll("[data-expires-ms]");
  if (clocks.length) {
    const tick = function () {
      const now = Date.now();
      clocks.forEach(function (el) {
        const left = Math.floor((Number(el.dataset.expiresMs) - now) / 1000);
        if (left <= 0) { el.textContent = "expired"; el.className = "state expired"; return; }
        const d = Math.floor(left / 86400), h = Math.floor(left % 86400 / 3600),
          m = Math.floor(left % 3600 / 60), s = left % 60;
        el.textContent = (d ? d + "d " : "") + h + "h " + m + "m " + s + "s";
      });
    };
    tick();
    setInterval(tick, 1000);
  }
})();
