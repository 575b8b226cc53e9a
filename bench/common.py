"""Helpers the benchmark scripts share: run metadata, saving results, timing.

Imported by `flce.py`, `flce_timeline.py`, `lse_merge.py`, `matmul_ceiling.py` and `service.py`
(run from the repository root as `python bench/<script>.py`, so this folder is on sys.path).
Only the standard library at import time: torch and triton are looked up when present, so the
CPU-only service benchmark can use it too.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def versions(*packages: str) -> dict[str, str]:
    """{package: version} of python and the named packages that are installed."""
    out = {"python": platform.python_version()}
    for name in packages:
        try:
            mod = importlib.import_module(name)
        except Exception:  # not installed, or broken on this host: leave it out
            continue
        out[name] = str(getattr(mod, "__version__", "installed"))
    return out


def nvidia_smi(
    query: str = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw",
    units: bool = True,
) -> str:
    """nvidia-smi's CSV line for `query` (values without units when `units` is False), or ""
    where there is no nvidia-smi."""
    fmt = "csv,noheader" if units else "csv,noheader,nounits"
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", f"--format={fmt}"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""


def run_meta(
    argv: list[str] | None = None, packages: tuple[str, ...] = ("torch", "triton")
) -> dict:
    """The header of every result file: date, command, machine, versions and the device."""
    argv = sys.argv if argv is None else argv
    meta: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "versions": versions(*packages),
    }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
        meta["versions"]["cuda"] = torch.version.cuda
        meta["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
        meta["nvidia_smi"] = nvidia_smi()
    return meta


def save_json(result: Any, path: Path | str | None) -> None:
    """Write `result` as indented JSON to `path` (parents created); nothing when path is None."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)


def median_ms(fn: Callable[[], Any], *, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds per call of `fn` on the GPU (triton.testing.do_bench: the L2 cache is
    flushed before every repetition; warmup and rep are budgets in milliseconds)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
