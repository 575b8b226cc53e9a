"""Where Triton kernels run: on a host without a GPU, under Triton's interpreter. The `kassay`
command and the pytest plugin both decide it before any kernel module is imported."""

from __future__ import annotations

import os


def ensure_triton_mode() -> None:
    """Triton kernels run under the interpreter when no GPU is present; the variable must be set
    before any kernel module is imported."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import shutil

    if shutil.which("nvidia-smi") is None:
        os.environ["TRITON_INTERPRET"] = "1"
