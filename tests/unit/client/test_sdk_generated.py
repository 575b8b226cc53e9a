"""The SDK is defined once (kassay_client/_async/): the blocking client is generated from it and
must be what the generator gives now, and both clients offer the same calls."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_sync", ROOT / "client" / "gen_sync.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_blocking_client_is_generated_from_the_async_one() -> None:
    assert _generator().stale() == [], "run `make sdk`"


def test_both_clients_offer_the_same_calls() -> None:
    from kassay_client import AsyncClient, Client
    from kassay_client.async_client import AsyncArtifacts, AsyncJobs, AsyncWorkers
    from kassay_client.client import Artifacts, Jobs, Workers

    def calls(cls: type) -> dict[str, list[str]]:
        return {
            name: list(inspect.signature(fn).parameters)
            for name, fn in vars(cls).items()
            if callable(fn) and not name.startswith("_")
        }

    for sync, aio in (
        (Client, AsyncClient),
        (Jobs, AsyncJobs),
        (Artifacts, AsyncArtifacts),
        (Workers, AsyncWorkers),
    ):
        assert calls(sync) == calls(aio), sync.__name__
        for name, fn in vars(aio).items():
            if callable(fn) and not name.startswith("_") and name not in ("iter", "events"):
                assert inspect.iscoroutinefunction(fn), f"{aio.__name__}.{name}"
