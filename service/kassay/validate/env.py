"""Device resolution and the environment record every result carries."""

from __future__ import annotations

import functools
import platform
import socket
import subprocess

import torch

from kassay import __version__
from kassay.contract.results import Environment
from kassay.validate.ceilings import CEILINGS_METHOD


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """'auto' picks cuda:0 when CUDA is present, else the CPU; 'cuda' means cuda:0."""
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {name!r} asked for, but CUDA is not available here")
        return torch.device("cuda", dev.index or 0)
    return dev


def _nvidia_smi(index: int) -> dict[str, str]:
    fields = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(zip(fields.split(","), (v.strip() for v in out.split(",")), strict=False))


@functools.lru_cache(maxsize=8)
def environment(device: torch.device) -> Environment:
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    if device.type == "cuda":
        idx = device.index or 0
        smi = _nvidia_smi(idx)
        name = torch.cuda.get_device_name(idx)
        clocks = {k: v for k, v in smi.items() if k.startswith(("clocks", "power"))}
        driver = smi.get("driver_version")
        cuda = torch.version.cuda
    else:
        name = platform.processor() or platform.machine() or "cpu"
        clocks, driver, cuda = {}, None, None
    return Environment(
        device=str(device),
        device_name=name,
        driver=driver,
        cuda=cuda,
        torch=torch.__version__,
        triton=triton_version,
        kassay=__version__,
        python=platform.python_version(),
        hostname=socket.gethostname(),
        clocks=clocks,
        ceilings_method=CEILINGS_METHOD,
    )
