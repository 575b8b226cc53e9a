"""What the blocking client does where the async one differs (kassay_client._aio)."""

from __future__ import annotations

import time
from collections.abc import Callable

from kassay_client.models import JobEvent

#: called with each event of a job
EventCallback = Callable[[JobEvent], None]

sleep = time.sleep


def call(fn: EventCallback, event: JobEvent) -> None:
    fn(event)
