"""flce's self-test probes (kassay.ops.probes): the mutants of kassay.ops.flce.mutants, each
with a grid that exposes it, or under a plain suite; and the fairness corpus's plain suite."""

from __future__ import annotations

from typing import Any

from kassay.ops.probes import Probe

_F = {"N": 48, "H": 32, "V": 80, "dtype": "float32"}

PROBES: tuple[Probe, ...] = (
    Probe("flce", "m_autocast_bias_none", {**_F, "autocast": "bfloat16", "bias": False}),
    Probe(
        "flce",
        "m_ignored_zero_div",
        dict(_F),
        ("all_ignored",),
        ("kassay",),
        "torch_native (F.linear_cross_entropy) also returns NaN when every target is ignored",
    ),
    Probe("flce", "m_none_grad_scale", {**_F, "reduction": "none"}),
    Probe("flce", "m_bf16_chunk_accum", {"N": 2048, "H": 64, "V": 96, "dtype": "bfloat16"}),
    Probe("flce", "m_label_smoothing_weight", {**_F, "label_smoothing": 0.1}),
    Probe("flce", "m_zeros", dict(_F)),
    Probe("flce", "m_grad_softmax_lost", dict(_F)),
    Probe("flce", "m_ce_weight_row_mean", {**_F, "ce_weight": True}),
    Probe("flce", "m_ce_weight_smoothing", {**_F, "ce_weight": True, "label_smoothing": 0.1}),
    Probe("flce", "m_token_scaling_grad", {**_F, "use_token_scaling": True}),
    Probe(
        "flce",
        "m_accuracy_counts_ignored",
        # the inputs plant argmax hits (about half the rows) whatever V
        {**_F, "return_token_accuracy": True, "ignore_fraction": 0.25},
    ),
    Probe(
        "flce",
        "m_accum_bf16_when_f32",
        {"N": 2048, "H": 64, "V": 96, "dtype": "bfloat16", "accum_dtype": "float32"},
    ),
)

# What a new user writes: shapes, dtypes, options; nothing aimed at a bug.
_PLAIN = {"N": 32, "H": 48, "V": 256, "dtype": "float32"}
PLAIN_PROBES: tuple[Probe, ...] = tuple(
    Probe("flce", m, _PLAIN, ("plain",), plain=True)
    for m in ("m_softcap_before_bias", "m_tail_rows_dropped", "m_count_in_bf16")
)

# Every dtype, and AMP (dtype x autocast: the combinations the op refuses come back skipped).
FAIRNESS: dict[str, Any] = {
    "N": 32,
    "H": 48,
    "V": 256,
    "dtype": ["float32", "float16", "bfloat16"],
    "autocast": ["none", "bfloat16", "float16"],
}
