"""Does GPU memory grow from group to group in one process (as in a worker's executor)?
Runs examples/ci-grid.yaml's groups with run_group on CUDA, with timing, and prints after each
group: allocated / reserved (PyTorch), used (cudaMemGetInfo), live CUDA graphs and live tensors
on the device; then the same after gc.collect(). Usage: python research/gpu_memory_probe.py"""

import gc
import sys
from pathlib import Path

import torch
import yaml

from kassay.validate import engine
from kassay.validate.spec import JobSpec, expand, local_impl_check


def snapshot(tag: str) -> None:
    free, total = torch.cuda.mem_get_info()
    graphs = sum(isinstance(o, torch.cuda.CUDAGraph) for o in gc.get_objects())
    dev = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    gib = 1 << 30
    print(
        f"{tag:28s} alloc {torch.cuda.memory_allocated() / gib:6.2f}  reserved "
        f"{torch.cuda.memory_reserved() / gib:6.2f}  used {(total - free) / gib:6.2f} GiB  "
        f"graphs {graphs}  cuda tensors {len(dev)} "
        f"({sum(t.numel() * t.element_size() for t in dev) / gib:.2f} GiB)",
        flush=True,
    )


def main() -> None:
    spec = JobSpec.model_validate(
        yaml.safe_load(
            Path(sys.argv[1] if len(sys.argv) > 1 else "examples/ci-grid.yaml").read_text()
        )
    )
    groups = expand(spec, check_impl=local_impl_check())
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else len(groups)
    for g in groups[:limit]:
        res = engine.run_group(g, device="cuda", ceilings=False)
        del res
        snapshot(f"{g.op} {g.group_id[:10]}")
    gc.collect()
    torch.cuda.empty_cache()
    snapshot("after gc + empty_cache")


if __name__ == "__main__":
    main()
