"""What routes get from the app: its settings, store, dispatcher, notifier and metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

from kassay.api.metrics import ApiMetrics
from kassay.api.notify import JobNotifier
from kassay.api.store import Store
from kassay.settings import Settings

if TYPE_CHECKING:
    from kassay.api.dispatch import Dispatcher


@dataclass
class Services:
    settings: Settings
    store: Store
    dispatcher: Dispatcher
    notifier: JobNotifier
    metrics: ApiMetrics


async def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc
