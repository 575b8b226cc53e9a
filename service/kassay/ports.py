"""Free ports for servers this process starts in other processes (`kassay serve`'s workers, the
tests' APIs and workers).

`bind((host, 0))` hands out a port from the kernel's ephemeral range, and that same range feeds
the local ports of outgoing connections: between the probe closing its socket and the started
server binding the port (seconds: a worker imports torch first), a gRPC, HTTP or PostgreSQL
client connection may take it (CI saw "[Errno 98] address already in use" from an API started
on such a port). Ports below the ephemeral range are never given to outgoing connections, so a
port picked there stays free unless someone binds it on purpose; the ports handed out in this
process are remembered so two callers never get the same one.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_given: set[int] = set()
_rng = random.Random(os.getpid())


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nobody listens on, below the ephemeral range when there is room."""
    high = _ephemeral_low()
    low = 10000
    if high - low >= 2000:
        for _ in range(200):
            port = _rng.randrange(low, high)
            if port not in _given and _bindable(port, host):
                _given.add(port)
                return port
    # no room below the ephemeral range (an unusual ip_local_port_range): the kernel's choice
    with socket.socket() as s:
        s.bind((host, 0))
        port = int(s.getsockname()[1])
    _given.add(port)
    return port
