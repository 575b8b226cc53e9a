"""How tensors cross between the trusted executor and the sandboxed impl runner.

Two transports with one interface, named in every call so both sides agree:
- `cuda-ipc` (a GPU worker): the sender copies its tensors into a dedicated device allocation
  and sends its IPC handle (kassay.worker.exchange.cuda_ipc); no trip through host memory.
- `files` (a CPU worker, or a GPU one where IPC is refused): raw files in the exchange folder,
  shared memory (/dev/shm) where it has room (kassay.worker.runner.sandbox.exchange_dir); the runner
  maps its inputs copy-on-write (kassay.worker.exchange.tensor_files).

Either way the trusted side lends fresh copies of the inputs for every call (an impl that writes
into its inputs changes nothing another impl sees) and takes copies of the outputs it judges
(nothing the runner does afterwards changes them); every header is checked before it is used.
Only JSON headers travel over the channel: nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch

from kassay.worker.exchange import cuda_ipc, tensor_files
from kassay.worker.exchange.tensor_files import TensorFileError

#: a call names at most this many tensors each way
MAX_TENSORS = 64


def _names(headers: Any) -> list[str]:
    if not isinstance(headers, dict) or len(headers) > MAX_TENSORS:
        raise TensorFileError(f"tensors must be a mapping of at most {MAX_TENSORS} names")
    for key in headers:
        if not isinstance(key, str) or not key.isidentifier() or len(key) > 64:
            raise TensorFileError(f"tensor name {key!r} is not a short identifier")
    return list(headers)


class FileExchange:
    """Raw tensor files in `root` (kassay.worker.exchange.tensor_files)."""

    name = "files"

    def __init__(self, root: str, device: torch.device) -> None:
        self.root = root
        self.device = device
        self._lent: list[str] = []

    def lend(self, tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, Any]:
        headers = tensor_files.write_all(tensors, self.root, prefix)
        self._lent += [h["file"] for h in headers.values()]
        return headers

    def release_lent(self) -> None:
        """The peer is done with what this side lent."""
        for name in self._lent:
            with contextlib.suppress(OSError):
                os.unlink(Path(self.root) / name)
        self._lent = []

    def take_copies(self, headers: Any, max_bytes: int) -> dict[str, torch.Tensor]:
        """Copies, owned here, of the tensors the peer lent (at most `max_bytes` together)."""
        out = {}
        total = 0
        try:
            for key in _names(headers):
                t = tensor_files.read(headers[key], self.root, self.device, max_bytes - total)
                total += t.numel() * t.element_size()
                out[key] = t
        finally:
            self.forget(headers)
        return out

    def take_views(self, headers: Any) -> dict[str, torch.Tensor]:
        """The lent tensors as they are, writes staying here (the runner's inputs)."""
        return {
            k: tensor_files.map_private(headers[k], self.root, self.device) for k in _names(headers)
        }

    def drop_views(self) -> None:
        """Done with what take_views returned (copy-on-write maps: nothing to do)."""

    def forget(self, headers: Any) -> None:
        """Remove the files the peer lent (it does not wait for us to)."""
        if not isinstance(headers, dict):
            return
        for h in headers.values():
            if isinstance(h, dict) and isinstance(h.get("file"), str):
                with contextlib.suppress(OSError):
                    os.unlink(Path(self.root) / os.path.basename(h["file"]))

    def close(self) -> None:
        self.release_lent()


class CudaIpcExchange:
    """Dedicated device allocations lent by CUDA IPC handle (kassay.worker.exchange.cuda_ipc)."""

    name = "cuda-ipc"
    KEYS = frozenset({"ipc", "offset", "dtype", "shape"})

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._lent: list[cuda_ipc.Buffer] = []
        self._views: cuda_ipc.Borrowed | None = None

    def lend(self, tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, Any]:
        del prefix  # a handle names the memory
        buf, headers = cuda_ipc.lend(tensors, self.device)
        self._lent.append(buf)
        return headers

    def release_lent(self) -> None:
        for buf in self._lent:
            buf.free()
        self._lent = []

    def _borrow(self, headers: Any, max_bytes: int, into: cuda_ipc.Borrowed) -> dict[str, Any]:
        out = {}
        total = 0
        for key in _names(headers):
            dtype, shape = tensor_files.check_header(headers[key], self.KEYS, max_bytes - total)
            t = into.tensor(headers[key], dtype, shape)
            total += t.numel() * t.element_size()
            out[key] = t
        return out

    def take_copies(self, headers: Any, max_bytes: int) -> dict[str, torch.Tensor]:
        borrowed = cuda_ipc.Borrowed(self.device)
        try:
            views = self._borrow(headers, max_bytes, borrowed)
            copies = {k: v.clone() for k, v in views.items()}
            torch.cuda.synchronize(self.device)  # copied before the memory is unmapped
            del views
        finally:
            borrowed.close()
        return copies

    def take_views(self, headers: Any) -> dict[str, torch.Tensor]:
        self.drop_views()
        self._views = cuda_ipc.Borrowed(self.device)
        return self._borrow(headers, 1 << 62, self._views)

    def drop_views(self) -> None:
        """Unmap what take_views returned (the lender frees it after our answer)."""
        if self._views is not None:
            self._views.close()
            self._views = None

    def forget(self, headers: Any) -> None:
        del headers

    def close(self) -> None:
        self.release_lent()
        self.drop_views()


Exchange = FileExchange | CudaIpcExchange
TRANSPORT_ERRORS = (TensorFileError, cuda_ipc.IpcError)
