"""Configuration of kassay's fused linear cross-entropy: one frozen object, passed explicitly.

`FlceConfig()` holds the shipped defaults (the tuning constants of `_flce_kernels`, measured on
the H200: see the comments there and research/NOTES-flce.md). A caller who needs another memory
budget, GEMM path or tile shape builds one with `dataclasses.replace(FlceConfig(), ...)` (or
`FlceConfig(field=...)`) and passes it as `config=` to `fused_linear_cross_entropy` or
`FusedLinearCrossEntropyLoss`. Nothing is read from the environment: the same call gives the
same kernels on every host. Results do not depend on the tile fields; `gw_accumulation` and
`memory_budget_bytes` change the rounding of grad_weight (see their notes).

Only the standard library and `_flce_kernels` (triton) are imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kassay.kernels import _flce_kernels as K

__all__ = ["DEFAULT_CONFIG", "DEFAULT_MEMORY_BUDGET_BYTES", "FlceConfig"]

#: Default bytes for the transient logits chunk. With the gradients themselves (V·H + N·H
#: elements) this keeps the peak extra memory at N=8192, H=4096, V=128256 bf16 near 1.47 GiB
#: (1792-row chunks; target 1.5) and at N=8192, H=2304, V=256000 at 1.59 GiB (960-row chunks;
#: target 1.6). 470 rather than 448 MiB: the second shape then gets 64-aligned chunks (960
#: rows, not 911), 2.3% faster on the H200 (research/results/flce-rows-probe-h200-2026-12-02.json).
DEFAULT_MEMORY_BUDGET_BYTES = 470 * 1024 * 1024

GwAccumulation = Literal["auto", "cublas"]
Schedule = Literal["auto", "rows", "vocab"]


@dataclass(frozen=True)
class FlceConfig:
    """Memory budget, GEMM path choices and launch tuning of one flce call.

    Memory and numerics:
        memory_budget_bytes: bytes of working memory beyond the inputs and the gradients (the
            row schedule's [rows, V] logits chunk, the vocabulary schedule's [N, P] panel):
            more bytes, fewer and larger chunks, more peak memory. The call's
            `memory_budget_bytes=` keyword, when given, wins over this field.
        schedule: "auto" (the faster of the two that fits the budget, by `plan_schedule`'s
            cost model), "rows" (row chunks, logits of a chunk kept, grad_weight accumulated
            over the chunks: 6·N·H·V FLOP) or "vocab" (vocabulary panels, logits recomputed in
            backward, every gradient written once: 8·N·H·V FLOP). Results differ only in
            rounding; see `kassay.kernels._flce_vocab`.
        gw_accumulation: grad_weight accumulation over several chunks for 16-bit weights.
            "auto": scaled float16 accumulator for bfloat16 weights, float32 for float16 (the
            shipped mode); "cublas": `addmm_` in the weight dtype, whose error grows with the
            number of chunks (a benchmark baseline, not for training).

    GEMM paths (Hopper-class GPUs; other devices take the plain kernels whatever these say):
        use_tma_gemm: the persistent TMA grad_weight kernel (False: the plain Triton kernel).
        gemm_tma_reduce: its accumulating epilogue as a TMA bulk reduce-add in L2 (False:
            load C, add, store; one float16 rounding per chunk fewer).
        defer_last_gw: for bfloat16 weights over several chunks, run the last chunk's
            grad_weight GEMM in backward and let its epilogue write the finished bfloat16
            gradient (no separate conversion pass over V·H).
        grads_fused: one persistent kernel for a chunk's grad_x and grad_weight when grad_x's
            tiles would end in a partly idle wave of SMs (needs `gemm_tma_reduce`).
        grads_fused_max_last_wave: the fullest last wave (fraction of the SMs) that still takes
            the fused kernel.

    Launch tuning (tuples as the launchers unpack them):
        ce_long_row_v: rows of at least this many columns take `ce_config_long_gpu`.
        ce_config_long_gpu, ce_config_gpu: CE kernel (BLOCK_V, num_warps, programs per SM;
            0 = one program per row).
        ce_pair: two blocks per CE loop step. ce_l2_hints: L2 eviction hints in the CE kernel.
        ce_block_v_interp: CE BLOCK_V under Triton's interpreter.
        gemm_config_gpu, gemm_config_interp: plain grad_weight GEMM (BLOCK_M, BLOCK_N, BLOCK_K,
            GROUP_M, num_warps, num_stages).
        gemm_tma_config_gpu, gemm_tma_rmw_config_gpu: TMA grad_weight GEMM (the six above plus
            EPI_SPLIT, CTAS_PER_SM), for launches whose epilogue does not / does load C.
        grads_fused_config_gpu: the fused grad_x + grad_weight kernel (six as above).
        fin_block_gpu, fin_block_interp: elements per program of the finalize kernel.
        vocab_stats_config_gpu, vocab_ce_config_gpu: the vocabulary schedule's panel kernels,
            the forward's statistics and the backward's dlogits (BLOCK_V, num_warps, programs
            per SM); vocab_min_cols: its narrowest panel (a smaller budget is
            exceeded rather than the panel made narrower); vocab_inplace_cols: the widest
            backward panel kept in grad_weight's unwritten rows (0: never there);
            vocab_forward_max_cols: the widest forward panel (the forward may use up to the
            gradients' bytes beyond the budget: its peak stays below the backward's);
            vocab_gx_cublas: grad_x's float32 accumulation by cuBLAS (`addmm` with
            `out_dtype`, where this torch has it) rather than the Triton TN kernel;
            vocab_keep_logits: when grad_weight is computed, the forward allocates it and
            leaves the logits of its first columns in its bytes for the backward, which then
            does not recompute them (`_flce_vocab.plan_kept`; the gradient is then held from
            forward to backward, as the row schedule holds its gradients).
    """

    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES
    schedule: Schedule = "auto"
    gw_accumulation: GwAccumulation = "auto"
    use_tma_gemm: bool = True
    gemm_tma_reduce: bool = K.GEMM_TMA_REDUCE
    defer_last_gw: bool = True
    grads_fused: bool = K.GRADS_FUSED
    grads_fused_max_last_wave: float = K.GRADS_FUSED_MAX_LAST_WAVE
    ce_long_row_v: int = K.CE_LONG_ROW_V
    ce_config_long_gpu: tuple[int, int, int] = K.CE_CONFIG_LONG_GPU
    ce_config_gpu: tuple[int, int, int] = K.CE_CONFIG_GPU
    ce_pair: bool = K.CE_PAIR
    ce_l2_hints: bool = K.CE_L2_HINTS
    ce_block_v_interp: int = K.CE_BLOCK_V_INTERP
    gemm_config_gpu: tuple[int, ...] = K.GEMM_CONFIG_GPU
    gemm_config_interp: tuple[int, ...] = K.GEMM_CONFIG_INTERP
    gemm_tma_config_gpu: tuple[int, ...] = K.GEMM_TMA_CONFIG_GPU
    gemm_tma_rmw_config_gpu: tuple[int, ...] = K.GEMM_TMA_RMW_CONFIG_GPU
    grads_fused_config_gpu: tuple[int, ...] = K.GRADS_FUSED_CONFIG_GPU
    fin_block_gpu: int = K.FIN_BLOCK_GPU
    fin_block_interp: int = K.FIN_BLOCK_INTERP
    vocab_stats_config_gpu: tuple[int, int, int] = K.VOCAB_STATS_CONFIG_GPU
    vocab_ce_config_gpu: tuple[int, int, int] = K.VOCAB_CE_CONFIG_GPU
    vocab_min_cols: int = K.VOCAB_MIN_COLS
    vocab_inplace_cols: int = K.VOCAB_INPLACE_COLS
    vocab_forward_max_cols: int = K.VOCAB_FORWARD_MAX_COLS
    vocab_gx_cublas: bool = K.VOCAB_GX_CUBLAS
    vocab_keep_logits: bool = K.VOCAB_KEEP_LOGITS

    def __post_init__(self) -> None:
        # fail at construction, not deep inside a launch
        if int(self.memory_budget_bytes) < 1:
            raise ValueError(
                f"memory_budget_bytes must be positive, got {self.memory_budget_bytes}"
            )
        if self.schedule not in ("auto", "rows", "vocab"):
            raise ValueError(f"schedule must be 'auto', 'rows' or 'vocab', got {self.schedule!r}")
        if int(self.vocab_inplace_cols) < 0 or int(self.vocab_forward_max_cols) < 1:
            raise ValueError("vocab_inplace_cols must be >= 0 and vocab_forward_max_cols >= 1")
        if int(self.vocab_min_cols) < 1:
            raise ValueError(f"vocab_min_cols must be >= 1, got {self.vocab_min_cols}")
        if self.gw_accumulation not in ("auto", "cublas"):
            raise ValueError(
                f"gw_accumulation must be 'auto' or 'cublas', got {self.gw_accumulation!r}"
            )
        if not 0.0 <= float(self.grads_fused_max_last_wave) <= 1.0:
            raise ValueError(
                f"grads_fused_max_last_wave must be in [0, 1], got {self.grads_fused_max_last_wave}"
            )
        for name, n in (
            ("ce_config_long_gpu", 3),
            ("ce_config_gpu", 3),
            ("vocab_stats_config_gpu", 3),
            ("vocab_ce_config_gpu", 3),
            ("gemm_config_gpu", 6),
            ("gemm_config_interp", 6),
            ("gemm_tma_config_gpu", 8),
            ("gemm_tma_rmw_config_gpu", 8),
            ("grads_fused_config_gpu", 6),
        ):
            value = getattr(self, name)
            if len(value) != n or not all(isinstance(v, int) for v in value):
                raise ValueError(f"{name} must be a tuple of {n} ints, got {value!r}")


#: The shipped configuration (what a call without `config=` runs).
DEFAULT_CONFIG = FlceConfig()
