"""Does a refused cudaHostRegister hurt the next kernel launch, and can kassay clear it? (#15:
page-locking the reference cache's host copies.)

Registers a host buffer twice through torch.cuda.cudart() (the second is refused:
cudaErrorHostMemoryAlreadyRegistered, 712), launches a kernel, then does the same after
calling cudaGetLastError of the libcudart torch loaded (found in /proc/self/maps, opened with
RTLD_NOLOAD). Found on the H200 (2026-12-04, torch 2.11+cu130,
results/cudart-error-probe-h200-2026-12-04.json): the launch after the refusal raised
"AcceleratorError: CUDA error: part or all of the requested memory range is already mapped";
after cudaGetLastError (which returned 712, then 0) it ran. Hence kassay.validate.reference_cache
clears the error after a refusal and locks nothing where it cannot find that function.

    python3 research/cudart_error_probe.py
"""

import ctypes
import json
import os

import torch


def main() -> None:
    res: dict[str, object] = {}
    torch.randn(4, device="cuda")  # the CUDA context first
    host = torch.empty(1 << 20, dtype=torch.float64)
    cudart = torch.cuda.cudart()
    ptr, n = host.data_ptr(), host.numel() * 8
    res["first"] = int(cudart.cudaHostRegister(ptr, n, 0))
    res["second"] = int(cudart.cudaHostRegister(ptr, n, 0))
    try:
        torch.randn(4, device="cuda").sum().item()
        res["launch_after_refusal"] = "ok"
    except Exception as e:
        res["launch_after_refusal"] = f"{type(e).__name__}: {str(e)[:200]}"
    # find the loaded libcudart
    with open("/proc/self/maps") as f:
        maps = f.read()
    libs = sorted({line.split()[-1] for line in maps.splitlines() if "libcudart" in line})
    res["libs"] = libs
    if libs:
        lib = ctypes.CDLL(libs[0], mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        res["third"] = int(cudart.cudaHostRegister(ptr, n, 0))
        res["get_last_error"] = int(lib.cudaGetLastError())
        res["get_last_error_again"] = int(lib.cudaGetLastError())
        try:
            torch.randn(4, device="cuda").sum().item()
            res["launch_after_clear"] = "ok"
        except Exception as e:
            res["launch_after_clear"] = f"{type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
