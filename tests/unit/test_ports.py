"""kassay.ports: ports for servers started in other processes stay clear of the ports the
kernel hands to outgoing connections, and are never handed out twice."""

import random
import socket

import pytest

from kassay import ports
from kassay.ports import _ephemeral_low, free_port


def test_free_ports_are_bindable_below_the_ephemeral_range_and_distinct() -> None:
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports[:5]:
        assert port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


class _Draws(random.Random):
    """Draws `first` before the ordinary random ports."""

    def __init__(self, first: list[int]) -> None:
        super().__init__(0)
        self.first = list(first)

    def randrange(self, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        return self.first.pop(0) if self.first else super().randrange(*args, **kwargs)


def test_a_listening_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(ports, "_rng", _Draws([taken]))
        got = free_port()
        assert got != taken and got < _ephemeral_low()


def test_a_port_already_handed_out_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    given = free_port()
    monkeypatch.setattr(ports, "_rng", _Draws([given]))
    assert free_port() != given
