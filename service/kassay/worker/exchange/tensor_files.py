"""Tensors between the trusted executor and the sandboxed impl runner, as raw files.

The transport of a CPU worker, and of a GPU worker where CUDA IPC is refused
(kassay.worker.exchange.transports). The trusted side writes an impl's inputs into the exchange
folder (shared memory, /dev/shm, where it has room; else the sandbox's working directory), the
runner maps them copy-on-write, and the trusted side reads the outputs back from there; the only other thing that crosses is a JSON header per tensor
(`{"file", "dtype", "shape"}`). Nothing is unpickled: what the sandbox writes is bytes, read
into a tensor of a dtype from a fixed list and a shape whose size must match the file exactly.
A header naming a path outside the directory, a link, a file with other names (hard links) or
more bytes than the caller allows is refused.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Set
from pathlib import Path
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}
MAX_DIMS = 8


class TensorFileError(ValueError):
    """A header or file the sandbox handed back that is not a tensor the caller accepts."""


def write(t: torch.Tensor, root: str | Path, name: str) -> dict[str, Any]:
    """Write `t` (any device) as raw bytes to root/name; returns its header."""
    dname = dtype_name(t.dtype)
    host = t.detach().contiguous().cpu()
    path = Path(root) / name
    with open(path, "wb") as f:
        f.write(host.view(torch.uint8).numpy().tobytes() if host.numel() else b"")
    os.chmod(path, 0o644)  # readable by the sandbox's own user
    return {"file": name, "dtype": dname, "shape": list(t.shape)}


def dtype_name(dtype: torch.dtype) -> str:
    """The name a header gives `dtype`; TensorFileError for one that cannot cross."""
    if dtype not in _NAMES:
        raise TensorFileError(f"dtype {dtype} cannot cross the sandbox")
    return _NAMES[dtype]


def check_header(header: Any, keys: Set[str], max_bytes: int) -> tuple[torch.dtype, list[int]]:
    """The dtype and shape of a header that has exactly `keys` (dtype and shape among them) and
    names at most `max_bytes`; TensorFileError otherwise."""
    if not isinstance(header, dict) or set(header) != keys:
        raise TensorFileError(f"a tensor header must be exactly {{{', '.join(sorted(keys))}}}")
    dtype_name, shape = header["dtype"], header["shape"]
    if dtype_name not in DTYPES:
        raise TensorFileError(f"tensor dtype {dtype_name!r} is not one of {', '.join(DTYPES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**62 for d in shape)
    ):
        raise TensorFileError(f"tensor shape {shape!r}: up to {MAX_DIMS} non-negative ints")
    dtype = DTYPES[dtype_name]
    size = math.prod(shape) * dtype.itemsize
    if size > max_bytes:
        raise TensorFileError(f"a tensor of {size} bytes, over the {max_bytes} allowed")
    return dtype, shape


def _open(header: Any, root: str | Path, max_bytes: int) -> tuple[Any, torch.dtype, list[int]]:
    """The checked file a header names, open, with its dtype and shape."""
    dtype, shape = check_header(header, {"file", "dtype", "shape"}, max_bytes)
    name = header["file"]
    if not isinstance(name, str) or not name or name != os.path.basename(name) or name[0] == ".":
        raise TensorFileError(f"tensor file {name!r}: a plain file name in the directory only")
    size = math.prod(shape) * dtype.itemsize
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(Path(root) / name, flags)
    except OSError as exc:
        raise TensorFileError(f"tensor file {name}: {exc.strerror}") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        f.close()
        raise TensorFileError(f"tensor file {name}: not a plain file of its own")
    if st.st_size != size:
        f.close()
        raise TensorFileError(f"tensor file {name}: {st.st_size} bytes, the header says {size}")
    return f, dtype, shape


def read(header: Any, root: str | Path, device: torch.device | str, max_bytes: int) -> torch.Tensor:
    """A copy of the tensor a header names under `root`, on `device`; TensorFileError when the
    header or the file is not what it must be."""
    f, dtype, shape = _open(header, root, max_bytes)
    with f:
        size = math.prod(shape) * dtype.itemsize
        data = bytearray(f.read(size))
    if len(data) != size:
        raise TensorFileError(f"tensor file {header['file']}: short read")
    flat = torch.frombuffer(data, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape).to(device)


def map_private(header: Any, root: str | Path, device: torch.device | str) -> torch.Tensor:
    """The tensor a header names, mapped copy-on-write (no read into memory; writes to it stay
    in this process) when `device` is the CPU, copied onto `device` otherwise."""
    f, dtype, shape = _open(header, root, 1 << 62)
    with f:
        n = math.prod(shape)
        if n == 0 or torch.device(device).type != "cpu":
            return read(header, root, device, 1 << 62)
        t = torch.from_file(str(Path(root) / header["file"]), shared=False, size=n, dtype=dtype)
    return t.reshape(shape)


def write_all(tensors: dict[str, torch.Tensor], root: str | Path, prefix: str) -> dict[str, Any]:
    """Headers of `tensors` written as root/<prefix>-<i>.bin."""
    return {k: write(t, root, f"{prefix}-{i}.bin") for i, (k, t) in enumerate(tensors.items())}
