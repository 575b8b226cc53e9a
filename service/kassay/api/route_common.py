"""What several routes share: reading a request body within a byte limit, parsing `label=k=v`
filters, and the error responses they document."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from kassay.api.schemas import ErrorBody
from kassay.errors import InvalidSpecError, PayloadTooLargeError

#: the error bodies (kassay's error tree) a route documents in OpenAPI
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    404: {"model": ErrorBody},
    409: {"model": ErrorBody},
    413: {"model": ErrorBody},
    422: {"model": ErrorBody},
}


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, read in chunks and refused (413) as soon as it passes `limit` bytes
    (or declares more): a job spec or an artifact never sits in memory past the limit."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(
            f"the body is {declared} bytes; the limit is {limit}", details={"limit": limit}
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(
                f"the body is over the limit of {limit} bytes", details={"limit": limit}
            )
        chunks.append(chunk)
    return b"".join(chunks)


def label_filters(values: list[str]) -> dict[str, str]:
    """`key=value` query filters as a dict (422 naming the bad one otherwise)."""
    out: dict[str, str] = {}
    for i, v in enumerate(values):
        k, sep, val = v.partition("=")
        if not sep or not k:
            raise InvalidSpecError(
                f"label filter {v!r} must be key=value",
                details={
                    "errors": [
                        {
                            "loc": ["query", "label", i],
                            "msg": "expected key=value",
                            "type": "value_error",
                        }
                    ]
                },
            )
        out[k] = val
    return out
