"""Device memory one process lends another through CUDA IPC (the driver API, through ctypes).

The trusted executor and the sandboxed impl runner (kassay.worker.executor.remote_impls) trade tensors on
a GPU without a trip through host memory: the lender copies them into a `Buffer` of its own, a
dedicated cuMemAlloc allocation (never a block of torch's caching allocator, whose segments hold
other tensors the borrower must not see), and sends its 64-byte handle; the borrower maps it
(`Borrowed`), checks every header against the mapping's true size (cuMemGetAddressRange: a
header past its end would fault the borrower's context) and reads the tensors as views of it.

Written against libcuda rather than torch.multiprocessing: torch's CUDA sharing keeps a
reference-count file in /dev/shm that both sides must open, which the sandbox's Landlock rules
and its own uid would have to allow, and it hands over a whole caching-allocator segment.

Only the standard library is imported at module level; torch is imported where tensors are made.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

HANDLE_BYTES = 64
#: every tensor in a buffer starts at a multiple of this (any dtype's view is then aligned)
ALIGN = 256
_LAZY_ENABLE_PEER_ACCESS = 1


class IpcError(RuntimeError):
    """CUDA IPC is unavailable here, or a handle or header does not name lent memory."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_BYTES)]


@functools.cache
def _driver() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise IpcError(f"no CUDA driver library: {exc}") from None
    ptr = ctypes.POINTER(ctypes.c_uint64)
    lib.cuMemAlloc_v2.argtypes = [ptr, ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
    lib.cuIpcOpenMemHandle_v2.argtypes = [ptr, _Handle, ctypes.c_uint]
    lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    lib.cuMemGetAddressRange_v2.argtypes = [ptr, ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    return lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(rc, ctypes.byref(name))
        raise IpcError(f"{what}: CUDA driver error {rc} ({(name.value or b'?').decode()})")


def _ensure_context(device: torch.device) -> None:
    """Make torch's (primary) context current on this thread: the driver calls need one."""
    import torch

    torch.cuda.set_device(device)
    torch.cuda.init()
    ctx = ctypes.c_void_p()
    _check(_driver().cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:  # the runtime makes it current lazily, on its first call on this thread
        torch.empty(1, device=device)
        _check(_driver().cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        raise IpcError("no CUDA context is current on this thread")


class _Interface:
    """Raw device memory as a uint8 array torch.as_tensor can view (keeps `owner` alive)."""

    def __init__(self, ptr: int, nbytes: int, owner: Any) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 2,
        }


def _view(ptr: int, size: int, owner: Any, device: torch.device) -> torch.Tensor:
    import torch

    if size == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.as_tensor(_Interface(ptr, size, owner), device=device)


def _offsets(nbytes: list[int]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for n in nbytes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, max(end, ALIGN)


class Buffer:
    """One cuMemAlloc allocation of this process that another may map (freed by `free`)."""

    def __init__(self, device: torch.device, nbytes: int) -> None:
        _ensure_context(device)
        self.device = device
        self.nbytes = nbytes
        ptr = ctypes.c_uint64()
        _check(_driver().cuMemAlloc_v2(ctypes.byref(ptr), nbytes), f"cuMemAlloc({nbytes})")
        self.ptr = ptr.value
        handle = _Handle()
        try:
            _check(_driver().cuIpcGetMemHandle(ctypes.byref(handle), self.ptr), "cuIpcGetMemHandle")
        except IpcError:
            self.free()
            raise
        self.handle = bytes(handle.reserved).hex()

    def bytes_at(self, offset: int, size: int) -> torch.Tensor:
        return _view(self.ptr + offset, size, self, self.device)

    def free(self) -> None:
        if self.ptr:
            _driver().cuMemFree_v2(self.ptr)
            self.ptr = 0


def lend(tensors: dict[str, torch.Tensor], device: torch.device) -> tuple[Buffer, dict[str, Any]]:
    """Copies of `tensors` (on `device`) in a new Buffer, and their headers
    {name: {"ipc", "offset", "dtype", "shape"}}; the copies are complete when this returns."""
    import torch

    from kassay.worker.exchange.tensor_files import dtype_name

    items = [(k, t.detach().contiguous()) for k, t in tensors.items()]
    names = [dtype_name(t.dtype) for _, t in items]  # refuses dtypes that cannot cross
    offsets, total = _offsets([t.numel() * t.element_size() for _, t in items])
    buf = Buffer(device, total)
    headers = {}
    for (key, t), off, dname in zip(items, offsets, names, strict=True):
        size = t.numel() * t.element_size()
        if size:
            buf.bytes_at(off, size).copy_(t.reshape(-1).view(torch.uint8))
        headers[key] = {"ipc": buf.handle, "offset": off, "dtype": dname, "shape": list(t.shape)}
    torch.cuda.synchronize(device)
    return buf, headers


@dataclass
class _Mapping:
    ptr: int
    size: int


class Borrowed:
    """Memory another process lent (by handle), mapped here until `close`."""

    def __init__(self, device: torch.device) -> None:
        _ensure_context(device)
        self.device = device
        self.maps: dict[str, _Mapping] = {}

    def _map(self, handle: Any) -> _Mapping:
        if not isinstance(handle, str) or len(handle) != 2 * HANDLE_BYTES:
            raise IpcError("a CUDA IPC handle is 64 bytes in hex")
        if handle not in self.maps:
            try:
                raw = bytes.fromhex(handle)
            except ValueError:
                raise IpcError("a CUDA IPC handle is 64 bytes in hex") from None
            ptr = ctypes.c_uint64()
            h = _Handle.from_buffer_copy(raw)
            _check(
                _driver().cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, _LAZY_ENABLE_PEER_ACCESS),
                "cuIpcOpenMemHandle",
            )
            base, size = ctypes.c_uint64(), ctypes.c_size_t()
            try:
                _check(
                    _driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr),
                    "cuMemGetAddressRange",
                )
            except IpcError:
                _driver().cuIpcCloseMemHandle(ptr.value)
                raise
            # the mapping may start inside an allocation: only what lies past it is lent
            self.maps[handle] = _Mapping(ptr.value, base.value + size.value - ptr.value)
        return self.maps[handle]

    def tensor(self, header: dict[str, Any], dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        """A view (not a copy) of the lent tensor a checked header names."""
        offset = header.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or offset % ALIGN:
            raise IpcError(f"offset {offset!r}: a non-negative multiple of {ALIGN}")
        m = self._map(header.get("ipc"))
        size = dtype.itemsize
        for d in shape:
            size *= d
        if offset + size > m.size:
            raise IpcError(f"{size} bytes at {offset} lie past the lent {m.size} bytes")
        return _view(m.ptr + offset, size, self, self.device).view(dtype).reshape(shape)

    def close(self) -> None:
        """Unmap everything (views made from it must be gone or unused)."""
        for m in self.maps.values():
            _driver().cuIpcCloseMemHandle(m.ptr)
        self.maps.clear()


def available(device: torch.device) -> str:
    """'' when this process can lend memory on `device`, else why not."""
    try:
        Buffer(device, ALIGN).free()
    except IpcError as exc:
        return str(exc)
    except Exception as exc:  # no CUDA at all
        return f"{type(exc).__name__}: {exc}"
    return ""
