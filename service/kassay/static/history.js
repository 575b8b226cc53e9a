/* kassay: a case key's history (device time, error, peak memory over jobs, oldest first), from
   the JSON the server put in <script class="history-data">. Regressions (against the job before)
   are red triangles; a click on a point opens its job. */
(function () {
  "use strict";
  var PLOTS = [
    ["device_median_ms", "device time, median ms (p10–p90 band)", "linear"],
    ["rel_l2", "rel-L2 (largest output)", "logarithmic"],
    ["peak_bytes", "peak extra MiB", "linear"]
  ];
  window.kassayCharts = window.kassayCharts || [];

  function draw(canvas, metric, title, yType, points) {
    var pts = points.filter(function (p) { return p[metric] !== null; });
    var bad = function (p) { return p.regressed[metric]; };
    var labels = pts.map(function (p) { return p.x; });
    var scale = metric === "peak_bytes" ? 1 / 1048576 : 1;
    var floor = metric === "rel_l2" ? 1e-18 : -Infinity;
    var main = {
      label: metric, showLine: true, borderColor: "#0969da", backgroundColor: "#0969da",
      pointRadius: pts.map(function (p) { return bad(p) ? 7 : 3; }),
      pointStyle: pts.map(function (p) { return bad(p) ? "triangle" : "circle"; }),
      pointBackgroundColor: pts.map(function (p) { return bad(p) ? "#cf222e" : "#0969da"; }),
      pointBorderColor: pts.map(function (p) { return bad(p) ? "#cf222e" : "#0969da"; }),
      data: pts.map(function (p) { return { x: p.x, y: Math.max(p[metric] * scale, floor), p: p }; })
    };
    var sets = [main];
    if (metric === "device_median_ms") {
      ["low", "high"].forEach(function (k, i) {
        sets.push({ label: k === "low" ? "p10" : "p90", band: true, showLine: true, pointRadius: 0,
          borderWidth: 0, backgroundColor: "rgba(9,105,218,.12)", fill: i ? "-1" : false,
          data: pts.filter(function (p) { return p[k] !== null; }).map(function (p) { return { x: p.x, y: p[k] }; }) });
      });
    }
    var chart = new Chart(canvas, {
      type: "scatter", data: { labels: labels, datasets: sets },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        onClick: function (_e, els) {
          var el = els.find(function (x) { return x.datasetIndex === 0; });
          if (el) { location.href = "/jobs/" + encodeURIComponent(pts[el.index].job_id); }
        },
        plugins: { title: { display: true, text: title }, legend: { display: false },
          tooltip: { callbacks: { label: function (ctx) {
            var p = (ctx.raw || {}).p;
            if (!p) { return ctx.dataset.label + ": " + ctx.parsed.y; }
            return [p.job_id + " " + p.status + ": " + Number(ctx.parsed.y).toPrecision(4)].concat((bad(p) ? p.reasons : []));
          } } } },
        scales: { x: { type: "category", labels: labels, title: { display: true, text: "commit / job (oldest first)" } },
          y: { type: yType, ticks: yType === "logarithmic" ? { callback: function (v) {
            var e = Math.log10(v); return Math.abs(e - Math.round(e)) < 1e-9 ? "1e" + Math.round(e) : ""; } } : {} } }
      }
    });
    window.kassayCharts.push({ plot: metric, chart: chart });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var el = document.querySelector("script.history-data");
    if (!el || typeof Chart === "undefined") { return; }
    var data = JSON.parse(el.textContent);
    PLOTS.forEach(function (p) {
      var canvas = document.querySelector('canvas[data-plot="' + p[0] + '"]');
      if (canvas) { draw(canvas, p[0], p[1], p[2], data.points); }
    });
  });
})();
