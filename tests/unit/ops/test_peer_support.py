"""What the third-party flce adapters declare unsupported: a case they cannot run must come back
`unsupported` with the reason, not as an error that reads like a bug (the H200 false-failure
table of 2026-12-03 had Cut Cross-Entropy failing every float32 case in its backward)."""

from __future__ import annotations

import torch

from kassay.ops.flce import FlceParams
from kassay.ops.flce.peers import _cce_supports

CUDA = torch.device("cuda")  # a device object only: nothing runs


def _p(**kw: object) -> FlceParams:
    return FlceParams(N=64, H=32, V=128, bias=False, **kw)  # type: ignore[arg-type]


def test_cce_needs_16_bit_inputs() -> None:
    for params in (_p(dtype="float32"), _p(dtype="float32", autocast="bfloat16")):
        why = _cce_supports(params, CUDA)
        assert why is not None and "bfloat16 or float16" in why
    assert _cce_supports(_p(dtype="bfloat16"), CUDA) is None
    assert _cce_supports(_p(dtype="float16"), CUDA) is None


def test_cce_refuses_options_it_lacks_and_the_cpu() -> None:
    assert "CUDA" in (_cce_supports(_p(dtype="bfloat16"), torch.device("cpu")) or "")
    assert _cce_supports(_p(dtype="bfloat16", label_smoothing=0.1), CUDA) is not None
    assert _cce_supports(_p(dtype="bfloat16", ce_weight=True), CUDA) is not None
