"""Static files of the dashboard and the HTML report: kassay's own CSS and scripts, and the one
vendored charting library (Chart.js 3.9.1 as Debian's libjs-chart.js ships it, with its license
beside it). The API serves them under /static/; the HTML report inlines them, so the file works
with no network."""

from __future__ import annotations

from functools import cache
from importlib import resources

#: the vendored charting library: pinned by file name (see README.md, "Dashboard")
CHART_JS = "chart-3.9.1.min.js"
CHART_JS_LICENSE = "chart-3.9.1.LICENSE.txt"

#: files served under /static/ with their media types; nothing else in the folder is served
MEDIA_TYPES = {
    CHART_JS: "text/javascript",
    CHART_JS_LICENSE: "text/plain",
    "kassay.css": "text/css",
    "report.js": "text/javascript",
    "live.js": "text/javascript",
    "history.js": "text/javascript",
}


@cache
def asset(name: str) -> str:
    """The text of one static file (KeyError for a name not in MEDIA_TYPES)."""
    if name not in MEDIA_TYPES:
        raise KeyError(name)
    return (resources.files(__package__) / name).read_text(encoding="utf-8")
