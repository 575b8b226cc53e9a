"""kassay's report formats in one registry: each format's name, media type, file extension,
what an Accept header may ask it by, and its renderer. The REST routes, the CLIs and the SDK's
contract test read it; a new format is one entry here and its module beside it.

    json      the versioned schema (kassay.report/v1, docs/report.schema.json)
    junit     JUnit XML for CI test reports
    markdown  a PR comment or CI step summary that leads with the verdict
    html      one self-contained page (style, scripts and Chart.js inlined)

The comparison's renderers (comparison_markdown, comparison_html) live beside them. Part of the
torch-free contract: the API imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kassay.contract.report_schema import report_schema, schema_json
from kassay.contract.results import Report
from kassay.reports.html import to_html
from kassay.reports.junit import to_junit
from kassay.reports.markdown import to_markdown


@dataclass(frozen=True)
class Format:
    name: str
    media_type: str
    extension: str
    render: Callable[[Report], str]
    #: other media types an Accept header may name it by
    accept: tuple[str, ...] = ()
    #: a text format served with `; charset=utf-8`
    charset: bool = False


def _json(report: Report) -> str:
    return report.model_dump_json(indent=2)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("json", "application/json", "json", _json),
        Format(
            "junit",
            "application/xml",
            "xml",
            to_junit,
            accept=("text/xml", "application/junit+xml"),
        ),
        Format("markdown", "text/markdown", "md", to_markdown, charset=True),
        Format("html", "text/html", "html", to_html, charset=True),
    )
}


def get(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown report format {name!r}; known: {', '.join(FORMATS)}") from None


def render(report: Report, name: str) -> str:
    return get(name).render(report)


def by_media_type(media: str) -> Format | None:
    """The format an Accept header's media type asks for."""
    for f in FORMATS.values():
        if media == f.media_type or media in f.accept:
            return f
    return None


__all__ = [
    "FORMATS",
    "Format",
    "by_media_type",
    "get",
    "render",
    "report_schema",  # the schema lives in kassay.contract.report_schema; kept here for callers
    "schema_json",
]
