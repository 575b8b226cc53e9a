"""Where the workers are: KASSAY_WORKERS entries, plain `host:port` addresses or `dns:///name:port`
names whose every address is a worker (a Kubernetes headless Service has one A record per ready
pod).

gRPC could resolve a `dns:///` target itself, but it would then balance calls over the addresses
behind one channel; the dispatcher needs one link per worker (it runs one group at a time on each
and counts what each offers), so names are resolved here, into one address per worker, and again
every KASSAY_WORKER_RESOLVE_S so that workers coming and going are followed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from kassay.contract.addresses import WorkerEntry, join_host_port, parse_entry

log = logging.getLogger("kassay.api.dispatcher")

#: (host, port) -> the addresses ("ip:port") the name has now; raises socket.gaierror
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """Every A record of `host` as sorted unique "ip:port" addresses; its AAAA records when it
    has no A record (an IPv6-only cluster). Not both: a dual-stack name would give each worker
    twice, and the dispatcher would count it as two."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    v4 = {str(info[4][0]) for info in infos if info[0] == socket.AF_INET}
    v6 = {str(info[4][0]) for info in infos if info[0] == socket.AF_INET6}
    return sorted(join_host_port(ip, port) for ip in (v4 or v6))


class WorkerDirectory:
    """The current worker addresses of a list of entries; `resolve()` looks the names up again.

    A name that does not exist (NXDOMAIN, no records: a headless Service with no ready pod) has
    no workers. A lookup that fails for any other reason (the resolver does not answer) keeps
    the addresses the name had, so a DNS hiccup does not drop every worker at once.
    """

    def __init__(self, entries: list[str], resolver: Resolver | None = None) -> None:
        self.entries = [parse_entry(e) for e in dict.fromkeys(entries)]
        self.resolver = resolver or getaddrinfo_resolver
        self._known: dict[str, list[str]] = {}  # dns entry text -> its last addresses

    @property
    def dynamic(self) -> bool:
        """Some entry is a DNS name (worth resolving again)."""
        return any(e.dns for e in self.entries)

    def static_addresses(self) -> dict[str, str | None]:
        """The plain addresses, known before any lookup (address -> None: not from a name)."""
        return {e.address: None for e in self.entries if not e.dns}

    async def resolve(self) -> dict[str, str | None]:
        """address -> the DNS name it was found by (None for a plain address), in entry order;
        an address listed plainly and also found by a name counts once."""
        out: dict[str, str | None] = {}
        for entry in self.entries:
            if not entry.dns:
                out.setdefault(entry.address, None)
                continue
            try:
                found = await self.resolver(entry.host, entry.port)
            except socket.gaierror as exc:
                if exc.errno in _NO_SUCH_NAME:
                    found = []
                else:
                    found = self._known.get(entry.text, [])
                    log.warning(
                        "cannot resolve %s (%s); keeping its %d known worker(s)",
                        entry.text,
                        exc,
                        len(found),
                    )
            except OSError as exc:
                found = self._known.get(entry.text, [])
                log.warning("cannot resolve %s (%s)", entry.text, exc)
            if found != self._known.get(entry.text):
                log.info("%s -> %s", entry.text, ", ".join(found) or "(no workers)")
            self._known[entry.text] = found
            for address in found:
                out.setdefault(address, entry.host)
        return out


# getaddrinfo's answers for a name that has no address (as opposed to "try again")
_NO_SUCH_NAME = frozenset(
    code
    for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)

__all__ = [
    "Resolver",
    "WorkerDirectory",
    "WorkerEntry",
    "getaddrinfo_resolver",
    "join_host_port",
    "parse_entry",
]
