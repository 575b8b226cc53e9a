"""Logging for kassay's processes (api, serve, worker): one place that sets the level and the
format, `text` for people or `json` (KASSAY_LOG_FORMAT) for a log pipeline: one JSON object per
line with the time, level, logger, message and the record's structured fields (the access log's
method, path, status, duration), by python-json-logger."""

from __future__ import annotations

import logging
import sys

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the access log's logger: one line per HTTP request the API answered
ACCESS = "kassay.access"


def configure(level: str | int = "INFO", fmt: str = "text") -> None:
    """Route every logger to stderr at `level` in `fmt` ("text" or "json"), replacing what was
    configured before (uvicorn's own handlers included: its loggers propagate to this one)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
