"""The device's own ceilings, measured once per process: a large matmul (TFLOP/s) and a large
device-to-device copy (GB/s, bytes read + written). The roofline fraction of a case is
max(flops / matmul ceiling, bytes / copy ceiling) / measured time: 1.0 means at the floor."""

from __future__ import annotations

import functools

import torch

from kassay.contract.spec import TimingPolicy
from kassay.validate.timing import time_call

#: What the environment record says of how `ceilings` were measured.
CEILINGS_METHOD = (
    "matmul: 8192^3 bf16 (512^3 fp32 on the CPU) on random normal data (zero operands draw "
    "less power and overstate the sustained ceiling by ~15% on an H200); copy: 512 MiB device "
    "to device; medians of repetitions without an L2 flush"
)


@functools.lru_cache(maxsize=4)
def measure_ceilings(device: torch.device) -> dict[str, float]:
    policy = TimingPolicy(warmup=2, min_reps=5, max_reps=20, budget_s=2.0, flush_l2=False)
    if device.type == "cuda":
        n, dtype, copy_elems = 8192, torch.bfloat16, 1 << 28  # 512 MiB bf16 each way
    else:
        n, dtype, copy_elems = 512, torch.float32, 1 << 24
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g).to(dtype)
    b = torch.randn(n, n, device=device, generator=g).to(dtype)
    mm = time_call(lambda: a @ b, device, policy)
    src = torch.randn(copy_elems // 2, device=device, generator=g).to(dtype)
    dst = torch.empty_like(src)
    cp = time_call(lambda: dst.copy_(src), device, policy)
    return {
        "matmul_tflops": 2 * n**3 / (mm.median_ms * 1e-3) / 1e12,
        "matmul_dtype_bits": float(torch.finfo(dtype).bits),
        "copy_gbps": 2 * src.numel() * src.element_size() / (cp.median_ms * 1e-3) / 1e9,
    }
