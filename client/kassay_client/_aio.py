"""What the async client does where the blocking one differs (kassay_client._io is its twin;
unasync swaps one for the other)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from kassay_client.models import JobEvent

#: called with each event of a job: a plain or a coroutine function
EventCallback = Callable[[JobEvent], Awaitable[None] | None]

sleep = asyncio.sleep


async def call(fn: EventCallback, event: JobEvent) -> None:
    out = fn(event)
    if inspect.isawaitable(out):
        await out
