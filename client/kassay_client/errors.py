"""The SDK's exception tree, by HTTP status (as openai-python does it):

KassayError
├── WaitTimeoutError             jobs.wait() ran past its timeout
└── APIError
    ├── APIConnectionError       the server could not be reached (after retries)
    │   └── APITimeoutError      the request timed out (after retries)
    └── APIStatusError           the server answered 4xx/5xx
        ├── BadRequestError              400
        ├── AuthenticationError          401
        ├── PermissionDeniedError        403
        ├── NotFoundError                404
        ├── ConflictError                409
        ├── PayloadTooLargeError         413
        ├── UnprocessableEntityError     422 (invalid spec, case cap, memory)
        ├── RateLimitError               429
        └── InternalServerError          5xx
"""

from __future__ import annotations

from typing import Any

import httpx


class KassayError(Exception):
    """Base of every error the SDK raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class WaitTimeoutError(KassayError):
    """The job was not over when the wait's timeout ran out (the job keeps running)."""

    def __init__(self, message: str, *, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


class APIError(KassayError):
    """Something went wrong talking to the API."""

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, body: Any = None
    ) -> None:
        super().__init__(message)
        self.request = request
        self.body = body


class APIConnectionError(APIError):
    """The server could not be reached (refused, reset, DNS ...)."""

    def __init__(
        self,
        message: str = "could not connect to the kassay API",
        *,
        request: httpx.Request | None = None,
    ) -> None:
        super().__init__(message, request=request)


class APITimeoutError(APIConnectionError):
    def __init__(
        self,
        message: str = "the request to the kassay API timed out",
        *,
        request: httpx.Request | None = None,
    ) -> None:
        super().__init__(message, request=request)


class APIStatusError(APIError):
    """The server answered with a 4xx or 5xx status. `code` is the server's error class name
    (e.g. UnknownImplError), `details` its structured details (field paths, allowed names)."""

    status_code: int

    def __init__(self, message: str, *, response: httpx.Response, body: Any = None) -> None:
        super().__init__(message, request=response.request, body=body)
        self.response = response
        self.status_code = response.status_code
        data = body if isinstance(body, dict) else {}
        self.code: str | None = data.get("error")
        self.details: dict[str, Any] = data.get("details") or {}


class BadRequestError(APIStatusError):
    pass


class AuthenticationError(APIStatusError):
    pass


class PermissionDeniedError(APIStatusError):
    pass


class NotFoundError(APIStatusError):
    pass


class ConflictError(APIStatusError):
    pass


class PayloadTooLargeError(APIStatusError):
    pass


class UnprocessableEntityError(APIStatusError):
    pass


class RateLimitError(APIStatusError):
    pass


class InternalServerError(APIStatusError):
    pass


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error(response: httpx.Response) -> APIStatusError:
    """The exception for an error response, carrying the server's message and details."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    message = body.get("message") if isinstance(body, dict) else None
    message = message or (body if isinstance(body, str) and body else response.reason_phrase)
    text = f"{response.status_code} {message}"
    cls = _BY_STATUS.get(response.status_code)
    if cls is None:
        cls = InternalServerError if response.status_code >= 500 else APIStatusError
    return cls(text, response=response, body=body)


__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "InternalServerError",
    "KassayError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "UnprocessableEntityError",
    "WaitTimeoutError",
    "status_error",
]
