"""Worker addresses, one definition for every process that reads them: a KASSAY_WORKERS entry
(`host:port` or `dns:///name:port`: the settings check it, the API's directory resolves it)
and whether an address stays on this host (the worker refuses to listen beyond loopback
unauthenticated; the API warns before it sends a token in clear text beyond it)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


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


DNS_PREFIX = "dns:"


@dataclass(frozen=True)
class WorkerEntry:
    """One KASSAY_WORKERS entry: an address, or a DNS name to resolve (`dns` set)."""

    text: str
    host: str
    port: int
    dns: bool

    @property
    def address(self) -> str:
        return self.text if not self.dns else f"{self.host}:{self.port}"


def parse_entry(text: str) -> WorkerEntry:
    """`host:port`, `[v6]:port`, or `dns:///name:port` (`dns:name:port` too, gRPC's short form).
    Raises ValueError naming what is wrong."""
    dns = text.startswith(DNS_PREFIX)
    rest = text[len(DNS_PREFIX) :] if dns else text
    if dns and rest.startswith("//"):
        authority, sep, rest = rest[2:].partition("/")
        if not sep or authority:
            raise ValueError(
                f"{text!r}: write dns:///NAME:PORT (a DNS server authority is not supported)"
            )
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        form = "dns:///NAME:PORT" if dns else "HOST:PORT"
        raise ValueError(f"{text!r}: a worker is {form} with a port between 1 and 65535")
    if dns and host.startswith("["):
        raise ValueError(f"{text!r}: dns:/// takes a name, not an address")
    return WorkerEntry(text=text, host=host, port=int(port_text), dns=dns)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
