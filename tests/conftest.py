"""Test-wide set-up.

TRITON_INTERPRET must be set before any Triton kernel module is imported, so it is decided here
from a cheap probe (no torch import) rather than from torch.cuda.is_available().
"""

import os
import shutil

if shutil.which("nvidia-smi") is None and not os.environ.get("CUDA_VISIBLE_DEVICES"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
