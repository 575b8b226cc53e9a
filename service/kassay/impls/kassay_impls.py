"""kassay's own Triton kernels as impls (`kassay` for flce and lse_merge), registered when the
kernel modules exist and Triton imports."""

from __future__ import annotations

import importlib
import logging

log = logging.getLogger(__name__)

for _mod in ("kassay.impls.kassay_flce", "kassay.impls.kassay_lse_merge"):
    try:
        importlib.import_module(_mod)
    except ImportError as exc:  # triton missing, or the kernel not built yet
        log.info("kassay impl %s not available: %s", _mod, exc)
