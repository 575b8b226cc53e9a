"""The async client: the SDK's one definition (kassay_client/_async/client.py), awaited.

async with AsyncClient("http://127.0.0.1:8000") as client:
    job = await client.jobs.create({"name": "x", "suites": [...]})
    job = await client.jobs.wait(job.id)
"""

from kassay_client._aio import EventCallback as AsyncEventCallback
from kassay_client._async.client import (
    AsyncArtifacts,
    AsyncClient,
    AsyncJobs,
    AsyncWorkers,
)

__all__ = ["AsyncArtifacts", "AsyncClient", "AsyncEventCallback", "AsyncJobs", "AsyncWorkers"]
