"""Whether a gRPC listen or target address stays on this host: the worker refuses to listen
beyond loopback unauthenticated, and the API refuses to send a token in clear text beyond it.
One definition for both ends of the channel."""

from __future__ import annotations

import ipaddress


def is_loopback(listen: str) -> bool:
    """Whether a listen address (HOST:PORT, [V6]:PORT, unix:PATH) is reachable from this host
    only. Names other than `localhost` count as reachable from elsewhere."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return True  # a socket file: guarded by its permissions
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
