"""Escaping and number formatting every report format shares (HTML, Markdown, scripts)."""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def num(v: float | None, fmt: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, fmt)


def json_for_script(data: Any) -> str:
    """JSON safe inside a <script> element (no "</script>", no "<!--")."""
    text = json.dumps(data, allow_nan=False, default=str, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# What could make sender text act as Markdown/HTML in a table cell: code, emphasis, links,
# raw HTML, cell breaks, strikethrough. (Intraword "_" stays readable: GFM ignores it.)
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|~])")


def md(text: str, limit: int = 200) -> str:
    """Text from a sender (names, labels, messages) as inert Markdown: one line, the
    characters of code, emphasis, links, HTML and cell breaks backslash-escaped, at most
    `limit` characters."""
    one_line = " ".join(str(text).split())
    if len(one_line) > limit:
        one_line = one_line[: limit - 1] + "…"
    return _MD_SPECIAL.sub(r"\\\1", one_line)


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None
