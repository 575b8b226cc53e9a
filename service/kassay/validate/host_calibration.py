"""The host's speed, measured beside every CPU repetition: a fixed workload that a comparison
between jobs divides each timing by, so that a shared runner's drift cancels out.

Why. On a shared CPU host the same code's median moves by 5-40% from one job to the next, even
in process CPU time (a hyperthread sibling, shared caches and memory bandwidth, frequency): a
ratio of two jobs' medians then confuses the host with the code (bench/README.md, "Comparisons:
noise"). The timing loop on the CPU runs this workload right after each repetition of the case
and records its time beside the case's (`TimingStats.calibration_ms`); the paired ratio
case / calibration moves with the code, not with the host, and the comparison
(kassay.validate.compare_reports) takes the ratio of those when both jobs carry the same calibration.

The workload is fixed (nothing in it depends on the case, so two jobs measure the same thing):
two float32 matmuls (256 x 256) and an exp and a row sum over 256 x 1024, about 0.8 ms on one
thread of a 2-core development box: compute-bound and memory-bound work like most cases, with a
working set (2.8 MiB) past the L2. It allocates nothing (every result goes to a buffer made
once): timed after an impl it would otherwise pay for the allocator state the impl left. Its
name carries the torch version and thread count, which change its speed: a comparison
normalises only when both jobs name the same calibration.

CPU only: on CUDA the device time is the GPU's own (CUDA events, graphs) and does not drift
with the host's load.
"""

from __future__ import annotations

import torch

#: bump when the workload changes: results with another version are not normalised against it
VERSION = "kassay.cal/1"
_SIZE, _ROWS, _COLS = 256, 256, 1024


class HostCalibration:
    """The fixed workload and its buffers (float32, CPU): `a`, `b` of (256, 256), `x` of
    (256, 1024); results into `c`, `d` (256, 256), `y` (256, 1024) and `s` (256,)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        # uniform in [0, 1/16): products and exps stay far from overflow and denormals
        self.a = torch.rand(_SIZE, _SIZE, generator=g) / 16
        self.b = torch.rand(_SIZE, _SIZE, generator=g) / 16
        self.x = torch.rand(_ROWS, _COLS, generator=g)
        self.c = torch.empty(_SIZE, _SIZE)
        self.d = torch.empty(_SIZE, _SIZE)
        self.y = torch.empty(_ROWS, _COLS)
        self.s = torch.empty(_ROWS)

    @property
    def name(self) -> str:
        """What was run where: the workload's version, the torch version and thread count."""
        return (
            f"{VERSION} (2 fp32 matmuls {_SIZE}x{_SIZE}, exp+sum {_ROWS}x{_COLS}; "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads)"
        )

    def __call__(self) -> None:
        torch.mm(self.a, self.b, out=self.c)
        torch.mm(self.c, self.b, out=self.d)
        torch.exp(self.x, out=self.y)
        torch.sum(self.y, dim=1, out=self.s)


_instance: HostCalibration | None = None


def host_calibration() -> HostCalibration:
    """The process's calibration workload (built on first use, 3 MiB)."""
    global _instance
    if _instance is None:
        _instance = HostCalibration()
    return _instance
