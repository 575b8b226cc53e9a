"""Triton kernels of kassay's fused linear cross-entropy (pure @triton.jit code + tuning).

Input checks and the public API live in `kassay.kernels.flce`, the autograd Function in
`_flce_autograd`, the launchers in `_flce_launch`. The tuning constants below are the defaults
of `kassay.kernels.flce_config.FlceConfig`, read once when it is defined: to run other values,
pass a `FlceConfig` (assigning to these names at run time changes nothing).

Kernels
- `_ce_rows_kernel`: one logits row at a time per program (grid stride over the rows). Pass 1
  streams the row once (online max / sum-exp in float32) and writes lse, the row's loss and
  z-loss; pass 2 (COMPUTE_GRAD) streams it again and overwrites the logits in place with
  dloss/dlogits, scaled per row. Each pass runs its full steps unmasked and one masked tail
  step (`_ce_stats_step`, `_ce_grad_step` / `_ce_grad_block`; `_ce_load` reads one block).
- `_gemm_tn_acc_kernel`: C[M, N] (+)= scale * A^T @ B with A [K, M], B [K, N] (the grad_weight
  GEMM dlogits^T @ x of one row chunk), accumulating in float32 registers and adding into C in
  C's dtype (float32, or a power-of-two-scaled float16 accumulator for bfloat16 weights).
  `_gemm_tn_acc_tma_kernel` is its Hopper variant (persistent, TMA; the accumulating epilogue
  is a TMA bulk reduce-add).
- `_grads_tma_kernel`: a chunk's grad_x = dlogits @ W and its grad_W GEMM in one persistent
  Hopper kernel, balanced so that grad_x's last wave leaves no SM idle.
- `_finalize_kernel`: out = (C * factor) cast to out's dtype; safe in place (out aliasing C)
  because every element is loaded before it is stored by the same program.

Row and matrix offsets are int64: N*V and V*H pass 2^31 at the shapes this op serves (offsets
within one logits row are int32: V < 2^31).
"""

import triton
import triton.language as tl

# ---- constexpr tuning -------------------------------------------------------------------------
# CE kernel launch on the GPU, (BLOCK_V, num_warps, programs per SM; 0 = one program per row).
# Rows of at least CE_LONG_ROW_V columns: one 32-warp program per SM looping over the rows (~132
# rows in flight: at V = 128256, 33 MB, a row's second pass can find it in L2); shorter rows: one
# program per row. CE_PAIR: two blocks per loop step (both loads in flight, one rescale exp per
# two elements). H200, one 1792 x 128256 bf16 chunk: 0.367 ms against 0.418-0.425 without
# pairing; 960 x 256000: 0.461 against 0.475-0.539 (research/results/flce-ce-pair-probe-h200-2026-12-02.json).
CE_LONG_ROW_V = 8192
CE_CONFIG_LONG_GPU = (8192, 32, 1)
CE_CONFIG_GPU = (4096, 16, 0)
CE_PAIR = True
# CE_L2_HINTS: pass 1 loads as evict_last, pass 2's loads and the dlogits stores as evict_first,
# so the stream of consumed columns and of written gradients does not push out of L2 the
# columns pass 2 has still to re-read (~132 rows in flight: 34 MB at V = 128256, 67 MB at
# 256000). H200: 0.324 -> 0.303 ms per 1792 x 128256 chunk, 0.416 -> 0.375 per 960 x 256000.
# Walking pass 2 backwards (it then starts on the columns read last) gained alone (0.316,
# 0.375) but not on top of the hints (0.320, 0.373): not kept
# (research/results/flce-ce-ab-h200-2026-12-02-l2.json).
CE_L2_HINTS = True
CE_BLOCK_V_INTERP = 64

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) for the grad_weight GEMM on Hopper.
GEMM_CONFIG_GPU = (128, 256, 64, 8, 8, 3)
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, EPI_SPLIT, CTAS_PER_SM) for its
# TMA/persistent variant (compute capability >= 9 and 16-byte aligned rows). CTAS_PER_SM > 1
# launches that many persistent programs per SM, so one's epilogue can overlap another's MMAs.
GEMM_TMA_CONFIG_GPU = (128, 256, 64, 8, 8, 3, 2, 1)
# GEMM_TMA_REDUCE: the TMA kernel's accumulating epilogue hands C += tile to the TMA unit as a
# bulk reduce-add (cp.reduce.async.bulk.tensor .add, done in L2) instead of loading C into
# registers, adding and storing: the SM no longer waits on the C load. Costs one more float16
# rounding per chunk (the tile scale * acc is rounded before the add).
GEMM_TMA_REDUCE = True
# Config of the launches whose epilogue loads C (the last chunk's FINAL epilogue, or every
# accumulating launch when GEMM_TMA_REDUCE is off): the C tile needs shared memory the
# reduce-add epilogue does not, so these cannot take more stages.
GEMM_TMA_RMW_CONFIG_GPU = (128, 256, 64, 8, 8, 3, 2, 1)
GEMM_CONFIG_INTERP = (32, 32, 32, 4, 4, 1)
# One persistent kernel for a chunk's grad_x and grad_W (`_grads_tma_kernel`), used on Hopper
# when grad_x alone would end in a partly idle wave: grad_x tiles (BLOCK_M x BLOCK_N) fill at
# least one wave of the SMs and the last wave at most GRADS_FUSED_MAX_LAST_WAVE of them. H200,
# 1792 x 4096 x 128256 (224 tiles on 132 SMs, last wave 70%): 5.52-5.91 ms against 5.79-6.00
# for cuBLAS grad_x + the TMA grad_W kernel; at one wave or less (1024 x 4096, 960 x 2304) it
# was 1-3% slower (research/results/flce-fused-probe-h200-2026-12-02-r6.json).
GRADS_FUSED = True
GRADS_FUSED_MAX_LAST_WAVE = 0.75
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) of both halves of that kernel.
GRADS_FUSED_CONFIG_GPU = (128, 256, 64, 8, 8, 3)

# Vocabulary schedule: panel kernels (BLOCK_V, num_warps, programs per SM) and the narrowest
# panel. Panels are short rows (P columns): a program walks a row at a time, so many small
# programs per SM keep enough loads in flight. Chosen per kernel by the probe
# research/flce_panel_kernels.py (git 678c58b; H100, research/results/
# flce-panel-kernels-h100-2026-12-07.json):
# the stats kernel at (512, 4, 16) took 47.6 us for a [8192, 4736] panel (69.0 at (2048, 8, 8)),
# 87.7 us with every option on (195.4); the grad kernel at (1024, 4, 16) matched (2048, 8, 8)
# plain (59.2 / 98.1 us at P = 4736 / 8192) and took 77.5 us with the options at P = 4736 (98.2).
VOCAB_STATS_CONFIG_GPU = (512, 4, 16)
VOCAB_CE_CONFIG_GPU = (1024, 4, 16)
VOCAB_MIN_COLS = 64
# Backward panels in grad_weight's unwritten rows: up to this many columns (the panel's
# scratch then takes N·P·2 / (H·2) rows of grad_weight, free until their own panels come).
# Forward panels: up to VOCAB_FORWARD_MAX_COLS, in the gradients' bytes.
VOCAB_INPLACE_COLS = 8192
VOCAB_FORWARD_MAX_COLS = 8192
# grad_x += dlogits @ W_p by cuBLAS into the float32 accumulator, where torch's addmm takes
# out_dtype (H100, N=8192, H=2304, V=256000: 65.5 -> 63.1 ms of device time, the Triton
# kernel's 17.5 ms of it at ~550 TFLOP/s; research/results/flce-vocab-profile-h100-2026-12-07-run4.json).
VOCAB_GX_CUBLAS = True
# The forward leaves the logits of grad_weight's first columns in grad_weight's own bytes
# (allocated in forward when grad_weight is wanted); the backward reads them instead of
# recomputing them: 2·N·H per kept column fewer FLOP (`_flce_vocab.plan_kept`).
VOCAB_KEEP_LOGITS = True

FIN_BLOCK_GPU = 4096
FIN_BLOCK_INTERP = 1024


LOG2E = tl.constexpr(1.4426950408889634)  # exp(u) = exp2(u * LOG2E): one FMA into exp2


@triton.jit
def _tanh(u):
    # float32 tanh accurate to a few ulp without libdevice (also runs under the interpreter):
    # odd Taylor series for |u| < 0.1 (truncation < 1e-10 relative), else (1-t)/(1+t), t=e^{-2|u|}.
    # The quotient is the fast (2-ulp, div.full) division, not the IEEE one, and callers
    # multiply by 1/softcap: softcap cost the vocabulary schedule +8.0% at N=8192, H=2304,
    # V=256000 with IEEE divisions, +6.6% without (H100, bench/results/flce-budgets-h100-
    # 2026-12-07-run4.json, flce-options-h100-2026-12-07-run2.json).
    a = tl.abs(u)
    u2 = u * u
    series = u * (1.0 + u2 * (-1.0 / 3.0 + u2 * (2.0 / 15.0 + u2 * (-17.0 / 315.0))))
    t = tl.exp(-2.0 * a)
    big = tl.fdiv(1.0 - t, 1.0 + t, ieee_rounding=False)
    big = tl.where(u < 0, -big, big)
    return tl.where(a < 0.1, series, big)


@triton.jit
def _ce_rows_kernel(
    z_ptr,  # [n_rows, V] logits chunk (x.dtype / autocast dtype); overwritten by dlogits
    stride_z,  # row stride of z, in elements
    tgt_ptr,  # [n_rows] int64 targets of this chunk
    loss_ptr,  # [n_rows] float32: CE + z-loss of each row (0 for ignored rows)
    zloss_ptr,  # [n_rows] float32: z-loss term alone
    lse_ptr,  # [n_rows] float32: natural-log lse of the (softcapped) logits
    scale_ptr,  # float32: row factor of the gradient, scalar (stride 0) or per row
    stride_scale,
    V,  # row length, < 2^31 - 2 * BLOCK_V (in-row offsets are int32)
    ignore_index,
    label_smoothing,
    z_loss_scale,
    softcap,
    n_rows,
    row_step,  # grid stride over the rows: the grid size (one row per program if it is n_rows)
    cew_ptr,  # HAS_WEIGHT: [V] float32 class weights (ce_weight); else None
    cew_sum_ptr,  # HAS_WEIGHT: float32 [1], the sum of all V class weights; else None
    zscale_ptr,  # HAS_WEIGHT: the z-loss term's row factor (strided like scale); else None
    acc_ptr,  # ACCURACY: [n_rows] float32, 1.0 where argmax(row) == target (valid rows); else None
    HAS_SOFTCAP: tl.constexpr,
    HAS_LS: tl.constexpr,  # label_smoothing != 0: the row's sum of logits is needed
    COMPUTE_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PAIR: tl.constexpr,
    HINTS: tl.constexpr,  # L2 eviction hints (see CE_L2_HINTS)
    HAS_WEIGHT: tl.constexpr = False,  # per-class weights (ce_weight)
    TOKEN_SCALING: tl.constexpr = False,  # row loss and gradient times p(target), detached
    ACCURACY: tl.constexpr = False,  # write acc_ptr (argmax found in pass 1)
):
    # Instruction count matters here: on the H200 this kernel kept 70% of the issue slots busy
    # at V = 128256 (ncu), so the full steps of a row run without masks, in-row offsets are
    # int32 (only the row base is int64) and every exp is one FMA into exp2.
    STEP: tl.constexpr = 2 * BLOCK_V if PAIR else BLOCK_V
    # float32 logits: exp2((z - m) * log2e), not exp2(z * log2e - m * log2e): at |z| ~ 1e3 the
    # rounding of z * log2e or of lse * log2e (u * |z|, ~1e-4) scales whole rows of
    # probabilities by 1e-4, ten times a float32 baseline's error; 16-bit logits round far
    # coarser than that, so they keep the one-FMA form.
    EXACT: tl.constexpr = z_ptr.dtype.element_ty == tl.float32
    # label smoothing with class weights: pass 1 sums w_v * z_v, pass 2 subtracts eg * w_v
    LSW: tl.constexpr = HAS_LS and HAS_WEIGHT
    v_full = (V // STEP) * STEP  # columns covered by unmasked steps; the rest is one tail step
    cols = tl.arange(0, BLOCK_V)
    for r in range(tl.program_id(0), n_rows, row_step):
        row = tl.cast(r, tl.int64)
        z_row = z_ptr + row * stride_z
        tgt = tl.load(tgt_ptr + row)
        valid = tgt != ignore_index
        # in bounds whatever the target: out-of-range ones are reported by the launcher
        tgt_safe = tl.where(valid & (tgt >= 0) & (tgt < V), tgt, 0).to(tl.int32)

        # pass 1: online max / sum of exp (/ sum of logits), all float32, per lane. PAIR: two
        # blocks per step, both loads in flight at once and one rescale exp per two elements.
        m_vec = tl.full([BLOCK_V], float("-inf"), tl.float32)
        s_vec = tl.zeros([BLOCK_V], tl.float32)
        sum_z = tl.zeros([BLOCK_V], tl.float32)
        idx_vec = tl.zeros([BLOCK_V], tl.int32)  # ACCURACY: per lane, first column of its max
        for v0 in range(0, v_full, STEP):
            m_vec, s_vec, sum_z, idx_vec = _ce_stats_step(
                z_row, v0, cols, V, m_vec, s_vec, sum_z, idx_vec, softcap, cew_ptr,
                HAS_SOFTCAP, HAS_LS, PAIR, BLOCK_V, False, HINTS, EXACT, LSW, ACCURACY,
            )  # fmt: skip
        if v_full < V:
            m_vec, s_vec, sum_z, idx_vec = _ce_stats_step(
                z_row, v_full, cols, V, m_vec, s_vec, sum_z, idx_vec, softcap, cew_ptr,
                HAS_SOFTCAP, HAS_LS, PAIR, BLOCK_V, True, HINTS, EXACT, LSW, ACCURACY,
            )  # fmt: skip
        m = tl.max(m_vec, axis=0)
        if ACCURACY:
            # the first column holding the row max (torch.argmax's tie rule): the smallest of
            # the lanes' first columns among the lanes whose max is the row max
            am = tl.min(tl.where(m_vec == m, idx_vec, V), axis=0)
            tl.store(acc_ptr + row, tl.where(valid & (am == tgt), 1.0, 0.0))
        s = tl.sum(s_vec * tl.exp2((m_vec - m) * LOG2E), axis=0)
        log_s = tl.log(s)
        lse = m + log_s
        zsum = tl.sum(sum_z, axis=0)

        z_t = tl.load(z_row + tgt_safe).to(tl.float32)
        if HAS_SOFTCAP:
            z_t = softcap * _tanh(z_t * (1.0 / softcap))
        eps_v = label_smoothing / V
        if HAS_WEIGHT:
            # torch's weighted CE with label smoothing, per row:
            # (1-ε)·w_t·(lse - z_t) + (ε/V)·Σ_v w_v·(lse - z_v); the z-loss is not weighted
            w_t = tl.load(cew_ptr + tgt_safe).to(tl.float32)
            w_sum = tl.load(cew_sum_ptr).to(tl.float32)
            loss = (1.0 - label_smoothing) * w_t * (lse - z_t) + eps_v * (w_sum * lse - zsum)
        else:
            loss = lse - (1.0 - label_smoothing) * z_t - eps_v * zsum
        zl = z_loss_scale * lse * lse
        if TOKEN_SCALING:
            # Liger's use_token_scaling: the row's loss (z-loss included) times the detached
            # probability of its target; the gradient below gets the same factor
            p_t = tl.exp(z_t - lse)
            loss = loss * p_t
            zl = zl * p_t
        loss = tl.where(valid, loss + zl, 0.0)
        zl = tl.where(valid, zl, 0.0)
        tl.store(loss_ptr + row, loss)
        tl.store(zloss_ptr + row, zl)
        tl.store(lse_ptr + row, lse)

        if COMPUTE_GRAD:
            g = tl.load(scale_ptr + row * stride_scale).to(tl.float32)
            g = tl.where(valid, g, 0.0)
            if TOKEN_SCALING:
                g = g * p_t
            if HAS_WEIGHT:
                # g scales the weighted CE, gz the z-loss (mean: 1/Σ w_t and 1/rows):
                # dloss/dz_v = cg * p_v - eg * w_v - tg * onehot_v
                gz = tl.load(zscale_ptr + row * stride_scale).to(tl.float32)
                gz = tl.where(valid, gz, 0.0)
                if TOKEN_SCALING:
                    gz = gz * p_t
                cg = ((1.0 - label_smoothing) * w_t + eps_v * w_sum) * g
                cg += 2.0 * z_loss_scale * lse * gz
                eg = eps_v * g
                tg = (1.0 - label_smoothing) * w_t * g
            else:
                # dloss/dz = g * (p * coef - eps/V - (1 - eps) * onehot), p = exp2(z log2e - lse
                # log2e), coef = 1 + 2 zls lse (d/dz [lse + zls lse^2] = p * coef)
                cg = (1.0 + 2.0 * z_loss_scale * lse) * g
                eg = eps_v * g
                tg = (1.0 - label_smoothing) * g
            # what _ce_grad_block subtracts: z - m - log_s keeps the digits lse = m + log_s
            # loses at |m| ~ 1e3 (EXACT), else z * log2e - lse * log2e in one FMA
            lse2 = m if EXACT else lse * LOG2E
            for v0 in range(0, v_full, STEP):
                _ce_grad_step(
                    z_row, v0, cols, V, tgt_safe - v0, lse2, log_s, cg, eg, tg, softcap, cew_ptr,
                    HAS_SOFTCAP, PAIR, BLOCK_V, False, HINTS, EXACT, LSW,
                )  # fmt: skip
            if v_full < V:
                _ce_grad_step(
                    z_row, v_full, cols, V, tgt_safe - v_full, lse2, log_s, cg, eg, tg, softcap,
                    cew_ptr, HAS_SOFTCAP, PAIR, BLOCK_V, True, HINTS, EXACT, LSW,
                )  # fmt: skip


@triton.jit
def _ce_load(
    z_row, offs, V, softcap, HAS_SOFTCAP: tl.constexpr, MASKED: tl.constexpr, EVICT: tl.constexpr
):
    """One block of a logits row as float32 (softcapped): z, -inf past V when MASKED.
    EVICT: the load's L2 eviction policy ("" for the default)."""
    if MASKED:
        mask = offs < V
        z = tl.load(z_row + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        if HAS_SOFTCAP:
            z = softcap * _tanh(z * (1.0 / softcap))
        z = tl.where(mask, z, float("-inf"))
    else:
        z = tl.load(z_row + offs, eviction_policy=EVICT).to(tl.float32)
        if HAS_SOFTCAP:
            z = softcap * _tanh(z * (1.0 / softcap))
    return z


@triton.jit
def _ce_stats_step(
    z_row, v0, cols, V, m_vec, s_vec, sum_z, idx_vec, softcap, cew_ptr,
    HAS_SOFTCAP: tl.constexpr, HAS_LS: tl.constexpr, PAIR: tl.constexpr,
    BLOCK_V: tl.constexpr, MASKED: tl.constexpr, HINTS: tl.constexpr, EXACT: tl.constexpr,
    LSW: tl.constexpr, ARGMAX: tl.constexpr,
):  # fmt: skip
    """Pass-1 update of the per-lane (max, sum of exp, sum of logits) by one (pair of) block(s)
    at column v0; masked lanes hold -inf (no exp mass) and add 0 to the logits sum. LSW: the
    logits sum is weighted by the class weights at cew_ptr. ARGMAX: idx_vec keeps each lane's
    first column of its max (strict >: a later equal value does not move it)."""
    EVICT: tl.constexpr = "evict_last" if HINTS else ""
    za = _ce_load(z_row, v0 + cols, V, softcap, HAS_SOFTCAP, MASKED, EVICT)
    if PAIR:
        zb = _ce_load(z_row, v0 + BLOCK_V + cols, V, softcap, HAS_SOFTCAP, MASKED, EVICT)
        m_new = tl.maximum(m_vec, tl.maximum(za, zb))
    else:
        zb = za
        m_new = tl.maximum(m_vec, za)
    if ARGMAX:
        if PAIR:  # za's column comes first: it wins a tie with zb
            b_wins = zb > za
            best = tl.where(b_wins, zb, za)
            best_idx = tl.where(b_wins, v0 + BLOCK_V + cols, v0 + cols)
        else:
            best = za
            best_idx = v0 + cols
        idx_vec = tl.where(best > m_vec, best_idx, idx_vec)
    # lanes still at -inf (never saw a finite column) keep s = 0 without NaN
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if EXACT:
        e = tl.exp2((za - m_safe) * LOG2E)
        if PAIR:
            e += tl.exp2((zb - m_safe) * LOG2E)
        s_vec = s_vec * tl.exp2((m_vec - m_safe) * LOG2E) + e
    else:
        m2 = m_safe * LOG2E
        e = tl.exp2(za * LOG2E - m2)
        if PAIR:
            e += tl.exp2(zb * LOG2E - m2)
        s_vec = s_vec * tl.exp2(m_vec * LOG2E - m2) + e
    if LSW:
        # masked lanes: w = 0 and z = -inf, so z is zeroed before the product (no NaN)
        wa = _cew_load(cew_ptr, v0 + cols, V, MASKED)
        sum_z += tl.where(wa != 0.0, za, 0.0) * wa
        if PAIR:
            wb = _cew_load(cew_ptr, v0 + BLOCK_V + cols, V, MASKED)
            sum_z += tl.where(wb != 0.0, zb, 0.0) * wb
    elif HAS_LS:
        if MASKED:
            sum_z += tl.where(v0 + cols < V, za, 0.0)
            if PAIR:
                sum_z += tl.where(v0 + BLOCK_V + cols < V, zb, 0.0)
        else:
            sum_z += za
            if PAIR:
                sum_z += zb
    return m_new, s_vec, sum_z, idx_vec


@triton.jit
def _cew_load(cew_ptr, offs, V, MASKED: tl.constexpr):
    """One block of the float32 class weights (0 past V when MASKED)."""
    if MASKED:
        return tl.load(cew_ptr + offs, mask=offs < V, other=0.0)
    return tl.load(cew_ptr + offs)


@triton.jit
def _ce_grad_step(
    z_row, v0, cols, V, tgt_rel, lse2, log_s, cg, eg, tg, softcap, cew_ptr,
    HAS_SOFTCAP: tl.constexpr, PAIR: tl.constexpr, BLOCK_V: tl.constexpr, MASKED: tl.constexpr,
    HINTS: tl.constexpr, EXACT: tl.constexpr, LSW: tl.constexpr,
):  # fmt: skip
    """Pass 2 on one (pair of) block(s) at column v0: dlogits written over the logits.
    tgt_rel: the target's column minus v0."""
    _ce_grad_block(
        z_row, v0, cols, V, tgt_rel, lse2, log_s, cg, eg, tg, softcap, cew_ptr,
        HAS_SOFTCAP, MASKED, HINTS, EXACT, LSW,
    )  # fmt: skip
    if PAIR:
        _ce_grad_block(
            z_row, v0 + BLOCK_V, cols, V, tgt_rel - BLOCK_V, lse2, log_s, cg, eg, tg, softcap,
            cew_ptr, HAS_SOFTCAP, MASKED, HINTS, EXACT, LSW,
        )  # fmt: skip


@triton.jit
def _ce_grad_block(
    z_row, v0, cols, V, tgt_rel, lse2, log_s, cg, eg, tg, softcap, cew_ptr,
    HAS_SOFTCAP: tl.constexpr, MASKED: tl.constexpr, HINTS: tl.constexpr, EXACT: tl.constexpr,
    LSW: tl.constexpr,
):  # fmt: skip
    """g · (p·coef − ε/V − (1−ε)·onehot) · (1 − tanh²) (the last factor with softcap only) of
    one block, as cg · p − eg − tg · onehot (LSW: cg · p − eg · w_v − tg · onehot, w the class
    weights). lse2: the row max m (EXACT, with log_s: lse = m + log_s) or lse·log2e."""
    EVICT: tl.constexpr = "evict_first" if HINTS else ""
    offs = v0 + cols
    zc = _ce_load(z_row, offs, V, softcap, HAS_SOFTCAP, MASKED, EVICT)
    egw = eg
    if LSW:
        egw = eg * _cew_load(cew_ptr, offs, V, MASKED)
    if EXACT:
        d = tl.exp2(((zc - lse2) - log_s) * LOG2E) * cg - egw
    else:
        d = tl.exp2(zc * LOG2E - lse2) * cg - egw
    d = tl.where(cols == tgt_rel, d - tg, d)
    if HAS_SOFTCAP:
        th = zc * (1.0 / softcap)
        d = d * (1.0 - th * th)
    if MASKED:
        tl.store(z_row + offs, d.to(z_row.dtype.element_ty), mask=offs < V, eviction_policy=EVICT)
    else:
        tl.store(z_row + offs, d.to(z_row.dtype.element_ty), eviction_policy=EVICT)


@triton.jit
def _gemm_tn_acc_kernel(
    a_ptr,  # A [K, M] (dlogits chunk [n_rows, V])
    b_ptr,  # B [K, N] (x chunk [n_rows, H])
    c_ptr,  # C [M, N] accumulator (grad_weight [V, H]) in float32 or float16
    scale_ptr,  # float32 scalar: C += scale * A^T B
    M,
    N,
    K,
    stride_ak,
    stride_am,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    o_ptr,  # OUT [M, N] with C's strides (FINAL only; may alias C)
    fin_ptr,  # float32 scalar (FINAL): OUT = (C + scale * A^T B) * fin
    ACCUMULATE: tl.constexpr,
    FINAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_mn(pid, num_pid_m, GROUP_M * num_pid_n, GROUP_M)

    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    mask_m = offs_m < M
    mask_n = offs_n < N

    a_ptrs = a_ptr + offs_k[:, None] * stride_ak + offs_m[None, :] * stride_am  # [BK, BM]
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # [BK, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = (k0 + offs_k) < K
        a = tl.load(a_ptrs, mask=kmask[:, None] & mask_m[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & mask_n[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(tl.trans(a), b, acc, input_precision="ieee")
        else:
            acc = tl.dot(tl.trans(a), b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    scale = tl.load(scale_ptr).to(tl.float32)
    out = acc * scale
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    cmask = mask_m[:, None] & mask_n[None, :]
    if ACCUMULATE:
        out += tl.load(c_ptrs, mask=cmask, other=0.0).to(tl.float32)
    if FINAL:  # last chunk: write the finished gradient (o may alias c: loaded before stored)
        out = out * tl.load(fin_ptr).to(tl.float32)
        o_ptrs = o_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=cmask)
    else:
        tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _gemm_tn_acc_tma_kernel(
    a_desc,  # TensorDescriptor over A [K, M] (dlogits chunk), block [BLOCK_K, BLOCK_M]
    b_desc,  # TensorDescriptor over B [K, N] (x chunk), block [BLOCK_K, BLOCK_N]
    c_desc,  # TensorDescriptor over C [M, N] accumulator, block [BLOCK_M, BLOCK_N // EPI_SPLIT]
    o_desc,  # TensorDescriptor over OUT [M, N] (FINAL only; may alias C), same block
    scale_ptr,  # float32 scalar: C += scale * A^T B
    fin_ptr,  # float32 scalar (FINAL): OUT = (C + scale * A^T B) * fin
    M,
    N,
    K,
    ACCUMULATE: tl.constexpr,
    FINAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    NUM_SMS: tl.constexpr,
    REDUCE: tl.constexpr = False,
):
    """Hopper variant of `_gemm_tn_acc_kernel`: persistent grid (one program per SM), TMA loads,
    the tile loop flattened into the K loop so the next tile's loads are in flight during this
    tile's epilogue (REDUCE: C += tile as a TMA bulk reduce-add; else C loaded, added, stored).
    Out-of-bounds TMA reads are zero, stores and reduce-adds are clipped."""
    start_pid = tl.program_id(0)
    num_pid_m, num_in_group, num_tiles, k_tiles = _tile_grid(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    scale = tl.load(scale_ptr).to(tl.float32)
    fin = 1.0
    if FINAL:
        fin = tl.load(fin_ptr).to(tl.float32)
    tile_id_c = start_pid - NUM_SMS  # separate epilogue counter (pipeliner-friendly)
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_mn(tile_id, num_pid_m, num_in_group, GROUP_M)
        om = pid_m * BLOCK_M
        on = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(k_tiles):
            ok = ki * BLOCK_K
            a = a_desc.load([ok, om])
            b = b_desc.load([ok, on])
            acc = tl.dot(a.T, b, acc)

        tile_id_c += NUM_SMS
        pid_m_c, pid_n_c = _tile_mn(tile_id_c, num_pid_m, num_in_group, GROUP_M)
        om_c = pid_m_c * BLOCK_M
        on_c = pid_n_c * BLOCK_N
        out = acc * scale
        if EPI_SPLIT == 2:
            _tma_epilogue_halves(c_desc, o_desc, out, om_c, on_c, fin, ACCUMULATE, FINAL, REDUCE)
        else:
            _tma_epilogue(c_desc, o_desc, out, om_c, on_c, fin, ACCUMULATE, FINAL, REDUCE)


@triton.jit
def _grads_tma_kernel(
    dlx_desc,  # dlogits chunk [rows, V], block [BLOCK_M, BLOCK_K]: grad_x's A
    w_desc,  # W [V, H], block [BLOCK_K, BLOCK_N]
    gx_desc,  # grad_x rows of the chunk [rows, H] (x dtype), block [BLOCK_M, BLOCK_N]
    dlw_desc,  # the same dlogits, block [BLOCK_K, BLOCK_M]: grad_W's A^T
    x_desc,  # x chunk [rows, H], block [BLOCK_K, BLOCK_N]
    c_desc,  # grad_W accumulator C [V, H], block [BLOCK_M, BLOCK_N // 2]
    scale_ptr,  # float32 scalar: C (+)= scale * dl^T x
    ROWS,
    H,
    V,
    ACCUMULATE: tl.constexpr,  # False: the first chunk stores into C
    REDUCE: tl.constexpr,  # the accumulating epilogue as a TMA reduce-add (GEMM_TMA_REDUCE)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    """grad_x = dl @ W (written, one rounding) and C (+)= scale * dl^T @ x for one row chunk, in
    one persistent grid of NUM_SMS programs, so no SM idles in grad_x's last wave.

    Schedule of program p: first its grad_x tiles (p, p + NUM_SMS, ...; every program starts
    at k = 0 together, so they share dl and W in L2). grad_x has T tiles; the first T % NUM_SMS
    programs get one more, so the others ("light") first take an extra share of grad_W tiles
    (as many k-steps as the grad_x tile they lack), grid-strided among themselves; then every
    program takes the remaining grad_W tiles grid-strided. Deterministic: no split-K, each
    output element is written by one program, in the same k order as `_gemm_tn_acc_tma_kernel`
    (grad_W is bit-identical to it)."""
    pid = tl.program_id(0)
    scale = tl.load(scale_ptr).to(tl.float32)
    # grad_x: M = rows, N = H, K = V
    mx, gx_group, tx, kx = _tile_grid(ROWS, H, V, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    for t in range(pid, tx, NUM_SMS):
        pm, pn = _tile_mn(t, mx, gx_group, GROUP_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(kx):
            a = dlx_desc.load([pm * BLOCK_M, ki * BLOCK_K])
            b = w_desc.load([ki * BLOCK_K, pn * BLOCK_N])
            acc = tl.dot(a, b, acc)
        gx_desc.store([pm * BLOCK_M, pn * BLOCK_N], acc.to(gx_desc.dtype))
    # grad_W: M = V, N = H, K = rows
    mw, gw_group, tw, kw = _tile_grid(V, H, ROWS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    rem = tx % NUM_SMS
    light = NUM_SMS - rem
    extra = 0
    if rem > 0:
        extra = tl.minimum(light * (kx // kw), tw)
    n_extra = 0
    if (pid >= rem) & (rem > 0):
        n_extra = tl.cdiv(tl.maximum(extra - (pid - rem), 0), light)
    n_common = tl.cdiv(tl.maximum(tw - extra - pid, 0), NUM_SMS)
    for i in tl.range(0, n_extra + n_common, flatten=True):
        t = tl.where(i < n_extra, (pid - rem) + i * light, extra + pid + (i - n_extra) * NUM_SMS)
        pm, pn = _tile_mn(t, mw, gw_group, GROUP_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(kw):
            a = dlw_desc.load([ki * BLOCK_K, pm * BLOCK_M])
            b = x_desc.load([ki * BLOCK_K, pn * BLOCK_N])
            acc = tl.dot(a.T, b, acc)
        _tma_epilogue_halves(
            c_desc, c_desc, acc * scale, pm * BLOCK_M, pn * BLOCK_N, 1.0, ACCUMULATE, False, REDUCE
        )


@triton.jit
def _tile_grid(
    M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """(m-blocks, tiles per GROUP_M group, tiles, k-steps) of an M x N output in BLOCK_M x
    BLOCK_N tiles over K in steps of BLOCK_K: what a persistent loop and `_tile_mn` need."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    return num_pid_m, GROUP_M * num_pid_n, num_tiles, k_tiles


@triton.jit
def _tile_mn(tile, num_pid_m, num_in_group, GROUP_M: tl.constexpr):
    """(m, n) block of a persistent loop's tile index, GROUP_M m-blocks walked down each
    n-column before moving right (num_in_group = GROUP_M * n-blocks), so concurrently resident
    tiles share their A rows in L2."""
    first_m = (tile // num_in_group) * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % group_size), (tile % num_in_group) // group_size


@triton.jit
def _tma_epilogue(
    c_desc,
    o_desc,
    out,
    om,
    on,
    fin,
    ACCUMULATE: tl.constexpr,
    FINAL: tl.constexpr,
    REDUCE: tl.constexpr,
):
    if ACCUMULATE and REDUCE and not FINAL:
        # C += out by the TMA unit (a bulk reduce-add in L2): nothing of C enters registers
        c_desc.atomic_add([om, on], out.to(c_desc.dtype))
    else:
        if ACCUMULATE:
            out += c_desc.load([om, on]).to(tl.float32)
        if FINAL:
            o_desc.store([om, on], (out * fin).to(o_desc.dtype))
        else:
            c_desc.store([om, on], out.to(c_desc.dtype))


@triton.jit
def _tma_epilogue_halves(
    c_desc, o_desc, out, om, on, fin,
    ACCUMULATE: tl.constexpr, FINAL: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """`_tma_epilogue` of a [BM, BN] tile as two [BM, BN // 2] column halves (descriptor blocks
    of half the tile: half the shared-memory staging buffer)."""
    bm: tl.constexpr = out.shape[0]
    half: tl.constexpr = out.shape[1] // 2
    o0, o1 = tl.split(tl.permute(tl.reshape(out, (bm, 2, half)), (0, 2, 1)))
    _tma_epilogue(c_desc, o_desc, o0, om, on, fin, ACCUMULATE, FINAL, REDUCE)
    _tma_epilogue(c_desc, o_desc, o1, om, on + half, fin, ACCUMULATE, FINAL, REDUCE)


@triton.jit
def _finalize_kernel(c_ptr, out_ptr, n, factor_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    f = tl.load(factor_ptr).to(tl.float32)
    c = tl.load(c_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (c * f).to(out_ptr.dtype.element_ty), mask=mask)


# ---- the vocabulary-panel schedule (`_flce_vocab`) ---------------------------------------------
# Logits are computed a [rows, P] panel of columns at a time (P = panel width) and never kept: the
# forward walks the panels once for each row's statistics, the backward walks them again and
# recomputes each panel's logits before turning them into dlogits. The two kernels below are the
# panel-sized halves of `_ce_rows_kernel` (same step functions, same float32 arithmetic).


@triton.jit
def _panel_stats_kernel(
    z_ptr,  # [n_rows, P] logits of columns [v0, v0 + P) (compute dtype)
    stride_z,
    tgt_ptr,  # [n_rows] int64 targets
    m_ptr,  # [n_rows] float32: running row max over the panels seen so far
    s_ptr,  # [n_rows] float32: running sum of exp(z - m)
    sz_ptr,  # HAS_LS: [n_rows] float32 running sum of (weighted) logits; else None
    zt_ptr,  # [n_rows] float32: the target's (softcapped) logit, written by its panel
    idx_ptr,  # ACCURACY: [n_rows] int32 running argmax column (first maximal); else None
    cew_ptr,  # LSW: [P] float32 class weights of the panel's columns; else None
    P,
    v0,
    softcap,
    n_rows,
    row_step,
    HAS_SOFTCAP: tl.constexpr,
    HAS_LS: tl.constexpr,
    LSW: tl.constexpr,  # label smoothing with class weights: sz sums w_v * z_v
    ACCURACY: tl.constexpr,
    FIRST: tl.constexpr,  # the first panel: store the state instead of merging into it
    BLOCK_V: tl.constexpr,
    PAIR: tl.constexpr,
):
    """One panel's pass-1 statistics of every row, merged into the running per-row state.

    Panels are launched in column order on one stream, so the merge needs no atomics: a row's
    state is read and written by one program per launch. The argmax keeps the earlier column on
    ties (a later panel moves it only with a strictly larger max), as torch.argmax."""
    STEP: tl.constexpr = 2 * BLOCK_V if PAIR else BLOCK_V
    EXACT: tl.constexpr = z_ptr.dtype.element_ty == tl.float32
    p_full = (P // STEP) * STEP
    cols = tl.arange(0, BLOCK_V)
    for r in range(tl.program_id(0), n_rows, row_step):
        row = tl.cast(r, tl.int64)
        z_row = z_ptr + row * stride_z
        m_vec = tl.full([BLOCK_V], float("-inf"), tl.float32)
        s_vec = tl.zeros([BLOCK_V], tl.float32)
        sum_z = tl.zeros([BLOCK_V], tl.float32)
        idx_vec = tl.zeros([BLOCK_V], tl.int32)
        for c0 in range(0, p_full, STEP):
            m_vec, s_vec, sum_z, idx_vec = _ce_stats_step(
                z_row, c0, cols, P, m_vec, s_vec, sum_z, idx_vec, softcap, cew_ptr,
                HAS_SOFTCAP, HAS_LS, PAIR, BLOCK_V, False, False, EXACT, LSW, ACCURACY,
            )  # fmt: skip
        if p_full < P:
            m_vec, s_vec, sum_z, idx_vec = _ce_stats_step(
                z_row, p_full, cols, P, m_vec, s_vec, sum_z, idx_vec, softcap, cew_ptr,
                HAS_SOFTCAP, HAS_LS, PAIR, BLOCK_V, True, False, EXACT, LSW, ACCURACY,
            )  # fmt: skip
        m = tl.max(m_vec, axis=0)
        s = tl.sum(s_vec * tl.exp2((m_vec - m) * LOG2E), axis=0)
        tgt = tl.load(tgt_ptr + row)
        rel = tgt - v0
        in_panel = (rel >= 0) & (rel < P)
        rel_safe = tl.where(in_panel, rel, 0).to(tl.int32)
        z_t = tl.load(z_row + rel_safe).to(tl.float32)
        if HAS_SOFTCAP:
            z_t = softcap * _tanh(z_t * (1.0 / softcap))
        old_t = tl.load(zt_ptr + row)
        tl.store(zt_ptr + row, tl.where(in_panel, z_t, old_t))
        if FIRST:
            tl.store(m_ptr + row, m)
            tl.store(s_ptr + row, s)
            if HAS_LS:
                tl.store(sz_ptr + row, tl.sum(sum_z, axis=0))
            if ACCURACY:
                am = tl.min(tl.where(m_vec == m, idx_vec, P), axis=0)
                tl.store(idx_ptr + row, am + v0)
        else:
            m_old = tl.load(m_ptr + row)
            s_old = tl.load(s_ptr + row)
            m_new = tl.maximum(m_old, m)
            s_new = s_old * tl.exp2((m_old - m_new) * LOG2E) + s * tl.exp2((m - m_new) * LOG2E)
            tl.store(m_ptr + row, m_new)
            tl.store(s_ptr + row, s_new)
            if HAS_LS:
                tl.store(sz_ptr + row, tl.load(sz_ptr + row) + tl.sum(sum_z, axis=0))
            if ACCURACY:
                am = tl.min(tl.where(m_vec == m, idx_vec, P), axis=0)
                old_idx = tl.load(idx_ptr + row)
                tl.store(idx_ptr + row, tl.where(m > m_old, am + v0, old_idx))


@triton.jit
def _panel_grad_kernel(
    z_ptr,  # [n_rows, P] logits of columns [v0, v0 + P); overwritten by dlogits
    stride_z,
    tgt_ptr,  # [n_rows] int64 targets
    lse2_ptr,  # [n_rows] float32: the row max m (EXACT) or lse * log2(e)
    logs_ptr,  # [n_rows] float32: log of the row's sum of exp(z - m) (EXACT only)
    cg_ptr,  # [n_rows] float32: dlogits = cg * p - eg (* w_v) - tg * onehot (then softcap')
    eg_ptr,
    tg_ptr,
    cew_ptr,  # LSW: [P] float32 class weights of the panel's columns; else None
    P,
    v0,
    softcap,
    n_rows,
    row_step,
    HAS_SOFTCAP: tl.constexpr,
    LSW: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PAIR: tl.constexpr,
):
    """Pass 2 of `_ce_rows_kernel` on one panel: dloss/dlogits written over the logits, with
    the row's coefficients (grad_output, reduction, class weights, z-loss and token scaling
    folded in) computed by the host from the forward's statistics."""
    STEP: tl.constexpr = 2 * BLOCK_V if PAIR else BLOCK_V
    EXACT: tl.constexpr = z_ptr.dtype.element_ty == tl.float32
    p_full = (P // STEP) * STEP
    cols = tl.arange(0, BLOCK_V)
    for r in range(tl.program_id(0), n_rows, row_step):
        row = tl.cast(r, tl.int64)
        z_row = z_ptr + row * stride_z
        rel = tl.load(tgt_ptr + row) - v0
        # outside the panel (or ignored): a column no lane holds, so no onehot term here
        tgt_rel = tl.where((rel >= 0) & (rel < P), rel, -2 * STEP).to(tl.int32)
        lse2 = tl.load(lse2_ptr + row)
        log_s = tl.load(logs_ptr + row)
        cg = tl.load(cg_ptr + row)
        eg = tl.load(eg_ptr + row)
        tg = tl.load(tg_ptr + row)
        for c0 in range(0, p_full, STEP):
            _ce_grad_step(
                z_row, c0, cols, P, tgt_rel - c0, lse2, log_s, cg, eg, tg, softcap, cew_ptr,
                HAS_SOFTCAP, PAIR, BLOCK_V, False, False, EXACT, LSW,
            )  # fmt: skip
        if p_full < P:
            _ce_grad_step(
                z_row, p_full, cols, P, tgt_rel - p_full, lse2, log_s, cg, eg, tg, softcap,
                cew_ptr, HAS_SOFTCAP, PAIR, BLOCK_V, True, False, EXACT, LSW,
            )  # fmt: skip
