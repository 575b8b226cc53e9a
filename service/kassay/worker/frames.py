"""Length-prefixed JSON frames: how the supervisor, the executor and the sandboxed impl runner
talk over a child's stdin/stdout (JSON, not pickle: a side must be able to read what a
sandboxed process sends without running any of it). Standard library only."""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, BinaryIO

_HEADER = struct.Struct(">I")
#: the largest message either side accepts (a result is a few KiB)
MAX_FRAME_BYTES = 64 << 20


class ProtocolError(ValueError):
    """A message that is not a length-prefixed JSON object within the size limit."""


class Channel:
    """Length-prefixed JSON frames over a pair of byte streams (both sides use it)."""

    def __init__(self, rfile: BinaryIO, wfile: BinaryIO) -> None:
        self.rfile, self.wfile = rfile, wfile

    @classmethod
    def from_stdio(cls) -> Channel:
        """Take fds 0/1 for the protocol; afterwards fd 0 is /dev/null and fd 1 is stderr."""
        rfd, wfd = os.dup(0), os.dup(1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        return cls(os.fdopen(rfd, "rb", buffering=0), os.fdopen(wfd, "wb", buffering=0))

    @staticmethod
    def encode(obj: dict[str, Any]) -> bytes:
        body = json.dumps(obj, default=str, separators=(",", ":")).encode()
        return _HEADER.pack(len(body)) + body

    @staticmethod
    def frame_size(head: bytes) -> int:
        size = int(_HEADER.unpack(head)[0])
        if size > MAX_FRAME_BYTES:
            raise ProtocolError(f"a message of {size} bytes (the limit is {MAX_FRAME_BYTES})")
        return size

    @staticmethod
    def decode(body: bytes) -> dict[str, Any]:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise ProtocolError(f"a message that is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ProtocolError("a message that is not a JSON object")
        return obj

    def send(self, obj: dict[str, Any]) -> None:
        self.wfile.write(self.encode(obj))
        self.wfile.flush()

    def _read(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = self.rfile.read(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def recv(self) -> dict[str, Any] | None:
        """The next message, or None at end of stream."""
        head = self._read(_HEADER.size)
        if head is None:
            return None
        body = self._read(self.frame_size(head))
        return None if body is None else self.decode(body)


__all__ = ["MAX_FRAME_BYTES", "Channel", "ProtocolError"]
