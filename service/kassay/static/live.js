/* kassay: live progress over the job event stream (server-sent events), no page reload.
   Jobs list: each active row on the page follows its job (the first few over SSE, the rest by
   polling, to stay under the browser's connections per host). Job page: counts and progress
   move with every result; the case tables and plots are re-read from the server at most every
   two seconds, and once more when the job is over. */
(function () {
  "use strict";
  var STREAMS = 4, POLL_MS = 3000, REFRESH_MS = 2000;
  // the case statuses the page counts: the server's one list, on <body data-statuses> (read
  // when needed: this script runs from <head>, before <body> exists)
  function counted() { return (document.body.dataset.statuses || "").split(" ").filter(Boolean); }

  function setCount(root, key, value) {
    root.querySelectorAll('[data-count="' + key + '"]').forEach(function (el) { el.textContent = String(value); });
  }
  function show(root, job) {
    var p = job.progress;
    counted().forEach(function (k) { setCount(root, k, p[k]); });
    setCount(root, "pending", p.total - p.done);
    setCount(root, "total", p.total);
    root.querySelectorAll("[data-done]").forEach(function (el) { el.textContent = p.done + "/" + p.total; });
    root.querySelectorAll(".progress>span").forEach(function (el) {
      el.style.width = (p.total ? 100 * p.done / p.total : 0) + "%";
    });
    root.querySelectorAll("[data-state]").forEach(function (el) {
      el.textContent = job.state + (job.ok === null ? "" : job.ok ? " · ok" : " · not ok");
      el.className = job.ok === null ? "" : job.ok ? "ok" : "bad";
    });
  }
  function snapshot(root) {
    var job = { state: root.dataset.jobState, ok: null, progress: { done: Number(root.dataset.jobDone), total: Number(root.dataset.jobTotal) } };
    counted().forEach(function (k) {
      var el = root.querySelector('[data-count="' + k + '"]');
      job.progress[k] = el ? Number(el.textContent) : 0;
    });
    return job;
  }

  /** Follow one job: onJob(job) after every change, onOver(job) once it is over. */
  function follow(id, root, stream, onOver) {
    var job = snapshot(root);
    if (!stream) {
      var timer = setInterval(function () {
        fetch("/v1/jobs/" + encodeURIComponent(id), { credentials: "same-origin" })
          .then(function (r) { return r.ok ? r.json() : null; })
          .then(function (j) {
            if (!j) { return; }
            show(root, j);
            if (j.state === "finished" || j.state === "cancelled") { clearInterval(timer); if (onOver) { onOver(j); } }
          }).catch(function () { /* the next poll retries */ });
      }, POLL_MS);
      return;
    }
    var es = new EventSource("/v1/jobs/" + encodeURIComponent(id) + "/events?after=" + job.progress.done);
    es.addEventListener("result", function (ev) {
      var r = JSON.parse(ev.data), seq = Number(ev.lastEventId);
      if (seq <= job.progress.done) { return; }
      job.progress.done = seq;
      job.progress[r.status] = (job.progress[r.status] || 0) + 1;
      if (job.state === "queued") { job.state = "running"; }
      show(root, job);
      root.dispatchEvent(new CustomEvent("kassay:result", { detail: r }));
    });
    es.addEventListener("final", function (ev) {
      es.close();
      job = JSON.parse(ev.data);
      show(root, job);
      if (onOver) { onOver(job); }
    });
  }

  function jobsList() {
    var rows = document.querySelectorAll("tr[data-job-id][data-active]");
    rows.forEach(function (row, i) { follow(row.dataset.jobId, row, i < STREAMS, null); });
  }

  function jobPage(page) {
    var cases = document.getElementById("cases");
    var pending = null, busy = false;
    function refresh() {
      pending = null;
      if (busy) { pending = setTimeout(refresh, REFRESH_MS); return; }
      busy = true;
      var open = Array.from(cases.querySelectorAll("tbody.case.open")).map(function (b) { return b.id; });
      fetch(cases.dataset.fragment, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (text) {
          if (text === null) { return; }
          cases.innerHTML = text;
          window.kassayReport.init(cases);
          open.forEach(function (id) {
            var b = document.getElementById(id);
            if (b) { b.classList.add("open"); b.querySelector("tr.detail").hidden = false; }
          });
        }).catch(function () { /* the next result retries */ })
        .then(function () { busy = false; });
    }
    page.addEventListener("kassay:result", function () {
      if (pending === null) { pending = setTimeout(refresh, REFRESH_MS); }
    });
    follow(page.dataset.jobId, page, true, function () {
      if (pending !== null) { clearTimeout(pending); }
      refresh();
      document.querySelectorAll("[data-when-over]").forEach(function (el) { el.hidden = false; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var page = document.querySelector("main[data-job-id][data-active]");
    if (page) { jobPage(page); } else { jobsList(); }
  });
})();
