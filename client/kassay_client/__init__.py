"""kassay_client: the Python SDK of the kassay service (HTTP only; no service imports).

from kassay_client import Client
client = Client("http://127.0.0.1:8000")          # or $KASSAY_SERVER / $KASSAY_TOKEN
job = client.jobs.create({"name": "smoke", "suites": [...]})
job = client.jobs.wait(job.id, timeout=600)
"""

__version__ = "0.1.0"

from kassay_client.async_client import AsyncClient
from kassay_client.client import Client
from kassay_client.errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    KassayError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
    WaitTimeoutError,
)
from kassay_client.models import (
    Artifact,
    CaseComparison,
    CaseResult,
    Comparison,
    ComparisonSummary,
    Job,
    JobEvent,
    JobPage,
    Progress,
    Report,
    Series,
    SeriesPoint,
    Summary,
    Worker,
)

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "Artifact",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "CaseComparison",
    "CaseResult",
    "Client",
    "Comparison",
    "ComparisonSummary",
    "ConflictError",
    "InternalServerError",
    "Job",
    "JobEvent",
    "JobPage",
    "KassayError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Progress",
    "RateLimitError",
    "Report",
    "Series",
    "SeriesPoint",
    "Summary",
    "UnprocessableEntityError",
    "WaitTimeoutError",
    "Worker",
    "__version__",
]
