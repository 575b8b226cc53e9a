"""Wake-ups for server-sent event streams: the dispatcher notifies a job when a result of it is
stored; the streams of that job wake and read the new results from the store. Streams also
re-read on a timer, so results stored by another API process show up too."""

from __future__ import annotations

import asyncio
import contextlib


class JobNotifier:
    """Per-job asyncio events; use from the event loop's thread only."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def notify(self, job_id: str) -> None:
        ev = self._events.pop(job_id, None)
        if ev is not None:
            ev.set()

    async def wait(self, job_id: str, timeout: float) -> None:
        """Return when `job_id` is notified or after `timeout` seconds."""
        ev = self._events.get(job_id)
        if ev is None:
            ev = self._events[job_id] = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout)
