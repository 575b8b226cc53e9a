"""The HTTP/2 keepalive policy of the API's channels to workers and of the worker's server: one
definition for both sides.

The API pings each worker every `interval_s` (default 10 s, KASSAY_GRPC_KEEPALIVE_S) while a
long group runs with no data on the stream (a CPU case can take minutes), so that a worker gone
silent is found within interval + timeout. A gRPC server's default policy refuses pings more
often than every 5 minutes without data and answers GOAWAY `too_many_pings` after two strikes:
every in-flight group of the job was then requeued ("UNAVAILABLE: Too many pings", #31), long
groups possibly forever. The worker therefore accepts pings without calls and as often as every
half interval. Set the same interval on the API and its workers.
"""

from __future__ import annotations

DEFAULT_INTERVAL_S = 10.0
#: how long a ping may go unanswered before the channel is considered dead
MAX_TIMEOUT_MS = 5_000


def client_options(interval_s: float = DEFAULT_INTERVAL_S) -> list[tuple[str, int]]:
    """The API side: ping every interval, with or without calls, however long no data flows."""
    ms = max(int(interval_s * 1000), 100)
    return [
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", min(MAX_TIMEOUT_MS, ms)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def server_options(interval_s: float = DEFAULT_INTERVAL_S) -> list[tuple[str, int]]:
    """The worker side: accept the API's pings (every half interval or slower, with or without
    calls) instead of answering GOAWAY too_many_pings."""
    ms = max(int(interval_s * 1000), 100)
    return [
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", ms // 2),
        ("grpc.http2.max_ping_strikes", 2),
    ]
