/* kassay: the per-case view of a job (the dashboard's job page and the HTML report).
   Sortable case tables, rows that expand, and the suites' plots drawn with Chart.js from the
   JSON the server put in <script class="plot-data">. window.kassayCharts lists the charts. */
(function () {
  "use strict";
  var PALETTE = ["#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a3069",
    "#57606a", "#fb8500", "#2da44e"];
  // A log axis cannot show 0: an exact result (rel-L2 0) is drawn one decade below the
  // smallest error of its plot, on a tick labelled "0 (exact)"
  function zeroAt(values) {
    var pos = values.filter(function (v) { return v > 0; });
    var low = pos.length ? Math.min.apply(null, pos) : 1e-7;
    return Math.pow(10, Math.floor(Math.log10(low)) - 1);
  }
  var SPEED = {
    tflops: ["TFLOP/s", function (p) { return p.tflops; }],
    gbps: ["GB/s", function (p) { return p.gbps; }],
    roofline: ["% of roofline", function (p) { return p.roofline === null ? null : 100 * p.roofline; }],
    device_ms: ["ms per call", function (p) { return p.device_ms; }]
  };
  window.kassayCharts = window.kassayCharts || [];

  function numeric(values) {
    return values.every(function (v) { return v !== "" && !isNaN(Number(v)); });
  }
  function sortedUnique(values) {
    var u = Array.from(new Set(values));
    if (numeric(u)) { u.sort(function (a, b) { return Number(a) - Number(b); }); } else { u.sort(); }
    return u;
  }
  function byImpl(points) {
    var m = new Map();
    points.forEach(function (p) { if (!m.has(p.impl)) { m.set(p.impl, []); } m.get(p.impl).push(p); });
    return Array.from(m.entries()).sort(function (a, b) { return a[0] < b[0] ? -1 : 1; });
  }
  function tooltip(ctx) {
    var r = ctx.raw || {};
    return (ctx.dataset.label || "") + ": " + Number(ctx.parsed.y).toPrecision(4) +
      (r.label ? " (" + r.label + ")" : "");
  }
  function logTick(v) { var e = Math.log10(v); return Math.abs(e - Math.round(e)) < 1e-9 ? "1e" + Math.round(e) : ""; }
  function options(xTitle, yTitle, yType, title) {
    return {
      animation: false, responsive: true, maintainAspectRatio: false,
      plugins: { title: { display: true, text: title }, tooltip: { callbacks: { label: tooltip } },
        legend: { labels: { boxWidth: 12 } } },
      scales: { x: { type: "category", title: { display: true, text: xTitle } },
        y: { type: yType, title: { display: true, text: yTitle }, ticks: yType === "logarithmic" ? { callback: logTick } : {} } }
    };
  }
  function scatter(canvas, labels, datasets, opts) {
    opts.scales.x.labels = labels;
    var chart = new Chart(canvas, { type: "scatter", data: { labels: labels, datasets: datasets }, options: opts });
    window.kassayCharts.push({ suite: Number(canvas.dataset.suite), plot: canvas.dataset.plot, chart: chart });
    return chart;
  }
  function dataset(impl, i, points, x, y) {
    return { label: impl, showLine: false, pointRadius: 4,
      borderColor: PALETTE[i % PALETTE.length], backgroundColor: PALETTE[i % PALETTE.length],
      pointStyle: points.map(function (p) { return p.status === "passed" ? "circle" : "crossRot"; }),
      data: points.map(function (p) { return { x: x(p), y: y(p), label: p.label, case: p.case }; }) };
  }

  function errorPlot(canvas, suite) {
    var pts = suite.points.filter(function (p) { return p.rel_l2 !== null; });
    var labels = sortedUnique(pts.map(function (p) { return p.x; }));
    var zero = zeroAt(pts.map(function (p) { return p.rel_l2; }));
    var ds = byImpl(pts).map(function (e, i) {
      return dataset(e[0], i, e[1], function (p) { return p.x; },
        function (p) { return p.rel_l2 > 0 ? p.rel_l2 : zero; });
    });
    var opts = options(suite.x_param, "rel-L2 (largest output)", "logarithmic",
      suite.op + ": error vs " + suite.x_param + " (× = not passed)");
    opts.scales.y.min = zero;
    opts.scales.y.ticks.callback = function (v) {
      return Math.abs(v - zero) <= zero * 1e-9 ? "0 (exact)" : logTick(v);
    };
    scatter(canvas, labels, ds, opts);
  }

  function speedPlot(canvas, suite, metric) {
    var get = SPEED[metric][1];
    var pts = suite.points.filter(function (p) { var v = get(p); return v !== null && v !== undefined; });
    var labels = sortedUnique(pts.map(function (p) { return p.shape; }));
    var ds = byImpl(pts).map(function (e, i) {
      return dataset(e[0], i, e[1], function (p) { return p.shape; }, get);
    });
    var yTitle = SPEED[metric][0] + (suite.cpu && metric === "device_ms" ? " (CPU clock)" : "");
    scatter(canvas, labels, ds, options("shape", yTitle, "linear", suite.op + ": speed, " + SPEED[metric][0]));
  }

  function memoryPlot(canvas, suite) {
    var pts = suite.points.filter(function (p) { return p.peak_bytes !== null; });
    var labels = sortedUnique(pts.map(function (p) { return p.shape; }));
    var ds = byImpl(pts).map(function (e, i) {
      return dataset(e[0], i, e[1], function (p) { return p.shape; },
        function (p) { return p.peak_bytes / 1048576; });
    });
    var model = new Map();
    suite.points.forEach(function (p) { if (p.model_bytes !== null && labels.indexOf(p.shape) >= 0) { model.set(p.shape, p.model_bytes); } });
    if (model.size) {
      ds.push({ label: "unavoidable (model)", model: true, showLine: true, borderDash: [4, 4],
        pointRadius: 0, borderColor: "#8c959f", backgroundColor: "#8c959f",
        data: labels.filter(function (l) { return model.has(l); }).map(function (l) {
          return { x: l, y: model.get(l) / 1048576 }; }) });
    }
    var title = suite.op + ": peak memory" + (pts.length ? "" : " (not measured on this device)");
    scatter(canvas, labels, ds, options("shape", "peak extra MiB", "linear", title));
  }

  function drop(root) {
    window.kassayCharts = window.kassayCharts.filter(function (c) {
      if (root.contains(c.chart.canvas)) { c.chart.destroy(); return false; }
      return true;
    });
  }

  function plots(root) {
    var el = root.querySelector("script.plot-data");
    if (!el || typeof Chart === "undefined") { return; }
    var suites = JSON.parse(el.textContent);
    root.querySelectorAll("canvas[data-plot]").forEach(function (canvas) {
      var suite = suites[Number(canvas.dataset.suite)];
      if (!suite) { return; }
      if (canvas.dataset.plot === "error") { errorPlot(canvas, suite); }
      if (canvas.dataset.plot === "memory") { memoryPlot(canvas, suite); }
      if (canvas.dataset.plot === "speed") {
        var select = document.createElement("select");
        select.setAttribute("aria-label", "speed metric");
        Object.keys(SPEED).forEach(function (k) {
          var o = document.createElement("option"); o.value = k; o.textContent = SPEED[k][0]; select.appendChild(o);
        });
        select.value = suite.speed_metric;
        select.addEventListener("change", function () {
          window.kassayCharts = window.kassayCharts.filter(function (c) {
            if (c.chart.canvas === canvas) { c.chart.destroy(); return false; } return true;
          });
          speedPlot(canvas, suite, select.value);
        });
        canvas.parentNode.insertBefore(select, canvas);
        speedPlot(canvas, suite, suite.speed_metric);
      }
    });
  }

  function cellValue(tbody, col) {
    var td = tbody.rows[0].cells[col];
    return td ? td.getAttribute("data-v") : "";
  }
  function sortable(root) {
    root.querySelectorAll("table.sortable").forEach(function (table) {
      table.querySelectorAll("thead th").forEach(function (th) {
        th.addEventListener("click", function () {
          var col = Number(th.dataset.col), asc = !th.classList.contains("asc");
          table.querySelectorAll("thead th").forEach(function (h) { h.classList.remove("asc", "desc"); });
          th.classList.add(asc ? "asc" : "desc");
          var bodies = Array.from(table.tBodies);
          bodies.sort(function (a, b) {
            var x = cellValue(a, col), y = cellValue(b, col);
            var nx = x === "" ? NaN : Number(x), ny = y === "" ? NaN : Number(y), r;
            if (!isNaN(nx) && !isNaN(ny)) { r = nx - ny; }
            else if (isNaN(nx) !== isNaN(ny) && (x === "" || y === "")) { return x === "" ? 1 : -1; }
            else { r = x < y ? -1 : x > y ? 1 : 0; }
            return asc ? r : -r;
          });
          bodies.forEach(function (b) { table.appendChild(b); });
        });
      });
    });
  }
  function toggle(tbody, open) {
    var detail = tbody.querySelector("tr.detail");
    var show = open === undefined ? detail.hidden : open;
    detail.hidden = !show;
    tbody.classList.toggle("open", show);
  }
  function expandable(root) {
    root.querySelectorAll("tbody.case tr.row").forEach(function (row) {
      row.addEventListener("click", function () { toggle(row.parentNode); });
      row.addEventListener("keydown", function (ev) { if (ev.key === "Enter") { toggle(row.parentNode); } });
    });
    root.querySelectorAll("a.jump").forEach(function (a) {
      a.addEventListener("click", function () {
        var t = document.getElementById(a.getAttribute("href").slice(1));
        if (t) { toggle(t, true); }
      });
    });
    if (location.hash.indexOf("#case-") === 0) {
      var t = document.getElementById(decodeURIComponent(location.hash.slice(1)));
      if (t && root.contains(t)) { toggle(t, true); }
    }
  }

  /** Wire up (or re-wire, after the job page replaced it) the cases under `root`. */
  function init(root) {
    drop(root);
    sortable(root);
    expandable(root);
    plots(root);
  }
  window.kassayReport = { init: init };
  document.addEventListener("DOMContentLoaded", function () {
    init(document.getElementById("cases") || document.body);
  });
})();
