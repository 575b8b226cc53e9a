"""KASSAY_WORKERS entries: plain addresses and dns:/// names, resolved (and resolved again) into
one address per worker; the resolver is replaced at the boundary (the DNS lookup) only."""

from __future__ import annotations

import asyncio
import socket

import pytest
from pydantic import ValidationError

from kassay.api.worker_discovery import WorkerDirectory, getaddrinfo_resolver, parse_entry
from kassay.settings import Settings


def test_entries_parse_and_bad_ones_fail_at_start() -> None:
    e = parse_entry("dns:///kassay-worker.ns.svc:50051")
    assert e.dns and (e.host, e.port) == ("kassay-worker.ns.svc", 50051)
    short = parse_entry("dns:kassay-worker:7")
    assert short.dns and (short.host, short.port) == ("kassay-worker", 7)
    plain = parse_entry("10.1.2.3:50051")
    assert not plain.dns and plain.address == "10.1.2.3:50051"
    assert parse_entry("[::1]:50051").host == "[::1]"
    for bad in ("dns:///kassay-worker", "dns://8.8.8.8/w:1", "host", "h:0", "h:99999", ":5"):
        with pytest.raises(ValueError):
            parse_entry(bad)
    # the settings refuse them at start, naming the entry
    with pytest.raises(ValidationError, match="kassay-worker"):
        Settings(workers="a:1,dns:///kassay-worker")
    assert Settings(workers="a:1,dns:///w:2").workers == ["a:1", "dns:///w:2"]


def test_localhost_resolves_to_loopback_with_the_system_resolver() -> None:
    found = asyncio.run(getaddrinfo_resolver("localhost", 50051))
    assert found and all(a.endswith(":50051") for a in found)
    assert "127.0.0.1:50051" in found or found == ["[::1]:50051"]


class Records:
    """A DNS zone whose answer the test changes; raises what getaddrinfo raises."""

    def __init__(self) -> None:
        self.answer: list[str] | BaseException = []
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return [f"{ip}:{port}" for ip in self.answer]


def test_directory_follows_changing_records() -> None:
    zone = Records()
    d = WorkerDirectory(["127.0.0.9:1", "dns:///kassay-worker:50051"], resolver=zone)
    assert d.dynamic and d.static_addresses() == {"127.0.0.9:1": None}

    zone.answer = ["10.0.0.1", "10.0.0.2"]
    assert asyncio.run(d.resolve()) == {
        "127.0.0.9:1": None,
        "10.0.0.1:50051": "kassay-worker",
        "10.0.0.2:50051": "kassay-worker",
    }
    assert zone.asked == [("kassay-worker", 50051)]
    zone.answer = ["10.0.0.2", "10.0.0.3"]  # a pod replaced
    assert list(asyncio.run(d.resolve())) == ["127.0.0.9:1", "10.0.0.2:50051", "10.0.0.3:50051"]

    # the resolver does not answer: the known workers stay
    zone.answer = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    assert list(asyncio.run(d.resolve())) == ["127.0.0.9:1", "10.0.0.2:50051", "10.0.0.3:50051"]
    # the name is gone (a headless Service with no ready pod): no workers behind it
    zone.answer = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert list(asyncio.run(d.resolve())) == ["127.0.0.9:1"]


def test_plain_only_is_not_dynamic() -> None:
    d = WorkerDirectory(["a:1", "a:1", "b:2"])
    assert not d.dynamic and list(d.static_addresses()) == ["a:1", "b:2"]
