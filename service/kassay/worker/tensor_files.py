"""Tensors between the trusted executor and the sandboxed impl runner, as raw files.

The trusted side writes an impl's inputs into the sandbox's working directory and reads its
outputs back from there; the only other thing that crosses is a JSON header per tensor
(`{"file", "dtype", "shape"}`). Nothing is unpickled: what the sandbox writes is bytes, read
into a tensor of a dtype from a fixed list and a shape whose size must match the file exactly.
A header naming a path outside the directory, a link, a file with other names (hard links) or
more bytes than the caller allows is refused.

On a CUDA worker the tensors go through host memory too (device -> file -> device); CUDA IPC
would spare the copies (a later step: it needs a GPU to test).
"""

from __future__ import annotations

import math
import os
import stat
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
    if t.dtype not in _NAMES:
        raise TensorFileError(f"{name}: dtype {t.dtype} cannot cross the sandbox")
    host = t.detach().contiguous().cpu()
    path = Path(root) / name
    with open(path, "wb") as f:
        f.write(host.view(torch.uint8).numpy().tobytes() if host.numel() else b"")
    os.chmod(path, 0o644)  # readable by the sandbox's own user
    return {"file": name, "dtype": _NAMES[t.dtype], "shape": list(t.shape)}


def read(header: Any, root: str | Path, device: torch.device | str, max_bytes: int) -> torch.Tensor:
    """The tensor a header names under `root`, on `device`; TensorFileError when the header or
    the file is not what it must be."""
    if not isinstance(header, dict) or set(header) != {"file", "dtype", "shape"}:
        raise TensorFileError("a tensor header must be exactly {file, dtype, shape}")
    name, dtype_name, shape = header["file"], header["dtype"], header["shape"]
    if not isinstance(name, str) or not name or name != os.path.basename(name) or name[0] == ".":
        raise TensorFileError(f"tensor file {name!r}: a plain file name in the directory only")
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
        raise TensorFileError(f"tensor {name}: {size} bytes, over the {max_bytes} allowed")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(Path(root) / name, flags)
    except OSError as exc:
        raise TensorFileError(f"tensor file {name}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise TensorFileError(f"tensor file {name}: not a plain file of its own")
        if st.st_size != size:
            raise TensorFileError(f"tensor file {name}: {st.st_size} bytes, the header says {size}")
        data = bytearray(f.read(size))
    if len(data) != size:
        raise TensorFileError(f"tensor file {name}: short read")
    flat = torch.frombuffer(data, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape).to(device)


def write_all(tensors: dict[str, torch.Tensor], root: str | Path, prefix: str) -> dict[str, Any]:
    """Headers of `tensors` written as root/<prefix>-<i>.bin."""
    return {k: write(t, root, f"{prefix}-{i}.bin") for i, (k, t) in enumerate(tensors.items())}


def read_all(
    headers: Any, root: str | Path, device: torch.device | str, max_bytes: int
) -> dict[str, torch.Tensor]:
    """The tensors of a {name: header} mapping (names: short identifiers)."""
    if not isinstance(headers, dict) or len(headers) > 64:
        raise TensorFileError("tensors must be a mapping of at most 64 names")
    out = {}
    total = 0
    for key, header in headers.items():
        if not isinstance(key, str) or not key.isidentifier() or len(key) > 64:
            raise TensorFileError(f"tensor name {key!r} is not a short identifier")
        t = read(header, root, device, max_bytes - total)
        total += t.numel() * t.element_size()
        out[key] = t
    return out
