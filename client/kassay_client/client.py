"""The blocking client, generated from the SDK's one definition (kassay_client/_async/client.py).

from kassay_client import Client

with Client("http://127.0.0.1:8000", token="...") as client:
    job = client.jobs.create(Path("examples/smoke.yaml"))
    job = client.jobs.wait(job.id, timeout=600)
    print(client.jobs.report(job.id, format="markdown"))
"""

from kassay_client._io import EventCallback
from kassay_client._sync.client import UNREACHABLE_GRACE_S, Artifacts, Client, Jobs, Workers

__all__ = ["UNREACHABLE_GRACE_S", "Artifacts", "Client", "EventCallback", "Jobs", "Workers"]
