"""Attention-state merge (softmax log-sum-exp correction): launchers and public API.

Given K partial attention outputs ``out_i`` with their log-sum-exp values ``lse_i`` (natural
log, base e), the merged state is::

    lse = log(sum_i exp(lse_i))
    out = sum_i exp(lse_i - lse) * out_i

computed with every exponent shifted by the row's largest LSE, so it is exact to float32
rounding for ``|lse|`` up to float32's range (no ``exp`` of an unshifted LSE anywhere).

Empty rows: a state whose LSE is ``-inf`` contributes nothing (its ``out`` row is not even
read); a row empty in every state gives ``out = 0`` and ``lse = -inf``, never NaN. FlashAttention-2
marks an empty row with ``lse = +inf``; with ``posinf_is_empty=True`` (the default) ``+inf`` is
read as ``-inf``. NaN in an LSE propagates to that row's result.

Layouts of the LSE tensors (``lse_layout``): ``"hT"`` = ``[..., Hh, S]`` (FlashAttention's
``softmax_lse``), ``"Th"`` = ``[..., S, Hh]``. Outs are always ``[..., S, Hh, D]``. ``...`` is
any number of batch dims (including none). Inputs may be non-contiguous views with any strides,
except that the last dim ``D`` of every out tensor must be contiguous (stride 1).

Only torch and triton are imported here (the GPU worker image has nothing else).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from kassay.kernels import _lse_merge_kernels as _k

LseLayout = Literal["hT", "Th"]
Accumulate = Literal["float32", "out_dtype"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_S_HH = 2**31 - 2**20
_MAX_GRID = 2**31 - 1

__all__ = ["LaunchConfig", "MergeConfig", "merge_state", "merge_state_", "merge_states"]


@dataclass(frozen=True)
class MergeConfig:
    """Tuning of one launch, passed as ``config=`` (the benchmark sweeps these; results do not
    depend on them).

    block_elems: rows x padded D one program handles per state; num_warps: warps per program;
    skip_empty_loads: do not read the out rows of empty states (weight 0); tile_tokens: tokens
    per tile (0 = auto: 8 when the LSE is contiguous along S, else 1); max_registers: cap on
    registers per thread (Triton's ``maxnreg``; 0 = the compiler's choice); pair_kernel: run
    K = 2 merges (float32 accumulation) on a two-state kernel with the in-place step's arithmetic,
    which needs fewer registers than the K-way kernel (False: the K-way kernel, for comparisons).
    """

    block_elems: int = _k.DEFAULT_BLOCK_ELEMS
    num_warps: int = _k.DEFAULT_NUM_WARPS
    skip_empty_loads: bool = _k.DEFAULT_SKIP_EMPTY_LOADS
    tile_tokens: int = 0
    max_registers: int = 0
    pair_kernel: bool = True


#: The name this class had before it was exported from `kassay.kernels`; kept for old imports.
LaunchConfig = MergeConfig

_DEFAULT_CONFIG = MergeConfig()


# K-way kernel constants the two-state kernel does not take.
_KWAY_ONLY = ("K", "ACC_IN_OUT_DTYPE")


def _register_cap(cfg: MergeConfig) -> dict[str, int]:
    """Launch option capping registers per thread, when the config asks for one."""
    return {"maxnreg": cfg.max_registers} if cfg.max_registers > 0 else {}


# --------------------------------------------------------------------------- validation helpers


# Plain-Python twins of triton.next_power_of_2 / triton.cdiv (those are jit-wrapped in recent
# Triton and cost microseconds each on the launch path).
def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pick_config(config: MergeConfig | None, old: MergeConfig | None) -> MergeConfig:
    """The launch config of a call: ``config``, or the deprecated ``_config`` keyword."""
    if old is not None:
        if config is not None:
            raise ValueError("pass config= only (_config is its deprecated former name)")
        warnings.warn(
            "the _config keyword is deprecated: pass config=", DeprecationWarning, stacklevel=3
        )
        config = old
    if config is None:
        return _DEFAULT_CONFIG
    if not isinstance(config, MergeConfig):
        raise ValueError(f"config must be a MergeConfig or None, got {type(config).__name__}")
    return config


def _check_layout(lse_layout: str) -> None:
    if lse_layout != "hT" and lse_layout != "Th":
        raise ValueError(
            f"lse_layout must be 'hT' ([..., Hh, S]) or 'Th' ([..., S, Hh]), got {lse_layout!r}"
        )


def _check_out_tensor(name: str, t: torch.Tensor, *, min_dim: int = 3) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dims ([..., S, Hh, D]), got {t.dim()}"
        )
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(
            f"{name} must be contiguous in its last dim D (stride 1), got strides {t.stride()}; "
            "call .contiguous() first"
        )


def _check_lse_tensor(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise ValueError(f"{name} must be float32 (natural-log LSE), got {t.dtype}")


def _lse_shape(out_shape: Sequence[int], lse_layout: str) -> tuple[int, ...]:
    """The LSE shape that goes with an out shape [..., S, Hh, D]."""
    *batch, s, hh, _ = out_shape
    return (*batch, hh, s) if lse_layout == "hT" else (*batch, s, hh)


def _lse_bsh(lse: torch.Tensor, lse_layout: str) -> torch.Tensor:
    """View an LSE tensor as [..., S, Hh] whatever its layout (a view, no copy)."""
    return lse.transpose(-1, -2) if lse_layout == "hT" else lse


def _batch_stride(t: torch.Tensor, start: int, nb: int) -> int | None:
    """Stride of dims [start, start + nb) of ``t`` merged into one, or None if they do not merge.

    Pure arithmetic on the strides (no views: the launch path stays cheap on the host).
    """
    shape, strides = t.shape, t.stride()
    merged: int | None = None
    prev_stride = 0
    for i in range(start + nb - 1, start - 1, -1):
        n = shape[i]
        if n == 1:
            continue
        if merged is None:
            merged = strides[i]
        elif strides[i] != prev_stride:
            return None
        prev_stride = strides[i] * n
    return 0 if merged is None else merged


def _seq_head_strides(t: torch.Tensor, lse_layout: str | None) -> tuple[int, int]:
    """(stride along S, stride along Hh) of an out tensor (layout None) or an LSE tensor."""
    st = t.stride()
    if lse_layout is None:
        return st[-3], st[-2]
    return (st[-1], st[-2]) if lse_layout == "hT" else (st[-2], st[-1])


def _tile(s: int, hh: int, block_d: int, lse_s_stride: int, cfg: MergeConfig) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_H) for a tile of about cfg.block_elems elements per state."""
    block_r = max(1, cfg.block_elems // block_d)
    sp, hp = _next_pow2(max(s, 1)), _next_pow2(max(hh, 1))
    want_t = cfg.tile_tokens or (
        _k.DEFAULT_TILE_TOKENS_CONTIGUOUS_S if lse_s_stride == 1 and s > 1 else 1
    )
    bt = min(sp, want_t, block_r)
    bh = min(hp, max(1, block_r // bt))
    bt = min(sp, max(1, block_r // bh))
    return bt, bh


def _foreach_batch(
    tensors: list[torch.Tensor],
    starts: list[int],
    nb: int,
    fn: Callable[[list[torch.Tensor]], None],
) -> None:
    """Slow path for batch dims whose strides cannot be merged into one: walk the first batch
    dim in Python (one launch per index) until the remaining ones merge. No data is copied."""
    if nb == 0 or all(
        _batch_stride(t, st, nb) is not None for t, st in zip(tensors, starts, strict=True)
    ):
        fn(tensors)
        return
    for i in range(tensors[0].shape[starts[0]]):
        sub = [t.select(st, i) for t, st in zip(tensors, starts, strict=True)]
        _foreach_batch(sub, starts, nb - 1, fn)


# ------------------------------------------------------------------------------- K-way merge


def merge_states(
    outs: torch.Tensor | Sequence[torch.Tensor],
    lses: torch.Tensor | Sequence[torch.Tensor],
    *,
    lse_layout: LseLayout = "hT",
    out_dtype: torch.dtype | None = None,
    accumulate: Accumulate = "float32",
    posinf_is_empty: bool = True,
    config: MergeConfig | None = None,
    _config: MergeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge K partial attention states into one (out-of-place), in one pass over the outs.

    Args:
        outs: ``[K, ..., S, Hh, D]`` partial outputs, float16, bfloat16 or float32 (a sequence
            of K tensors ``[..., S, Hh, D]`` is stacked first, which costs one copy). ``D`` must
            be contiguous; other strides are free.
        lses: their log-sum-exp values, **natural log**, float32, ``[K, ..., Hh, S]`` for
            ``lse_layout="hT"`` or ``[K, ..., S, Hh]`` for ``"Th"`` (a sequence is stacked).
        lse_layout: ``"hT"`` or ``"Th"``, see above; the returned lse uses the same layout.
        out_dtype: dtype of the returned out (default: the outs' dtype).
        accumulate: ``"float32"`` (default) sums the K weighted outs in float32 and rounds once;
            ``"out_dtype"`` rounds the running sum to ``out_dtype`` after every state, as a
            step-by-step merge kept in the output dtype would (for validation studies).
        posinf_is_empty: read ``lse = +inf`` (FlashAttention-2's mark of an empty row) as
            ``-inf``. Default True.
        config: launch tuning (`MergeConfig`); default ``MergeConfig()``. ``_config`` is its
            deprecated former name.

    Returns:
        ``(out, lse)``: out ``[..., S, Hh, D]`` in ``out_dtype``, contiguous; lse float32,
        natural log, ``[..., Hh, S]`` ("hT") or ``[..., S, Hh]`` ("Th"), contiguous. Rows empty
        in every state get out 0 and lse ``-inf``.
    """
    _check_layout(lse_layout)
    if accumulate not in ("float32", "out_dtype"):
        raise ValueError(f"accumulate must be 'float32' or 'out_dtype', got {accumulate!r}")
    if not isinstance(outs, torch.Tensor):
        outs = list(outs)
        if not outs:
            raise ValueError("outs is an empty sequence: need at least one state")
        for i, t in enumerate(outs):
            _check_out_tensor(f"outs[{i}]", t)
        try:
            outs = torch.stack(outs)
        except RuntimeError as e:
            raise ValueError(f"outs: the K states must share shape, dtype and device: {e}") from e
    if not isinstance(lses, torch.Tensor):
        lses = list(lses)
        if not lses:
            raise ValueError("lses is an empty sequence: need at least one state")
        for i, t in enumerate(lses):
            _check_lse_tensor(f"lses[{i}]", t)
        try:
            lses = torch.stack(lses)
        except RuntimeError as e:
            raise ValueError(f"lses: the K states must share shape and device: {e}") from e
    _check_out_tensor("outs", outs, min_dim=4)
    _check_lse_tensor("lses", lses)
    k = outs.shape[0]
    if k < 1:
        raise ValueError("outs has K = 0 states: need at least one")
    expected = (k, *_lse_shape(outs.shape[1:], lse_layout))
    if tuple(lses.shape) != expected:
        raise ValueError(
            f"lses has shape {tuple(lses.shape)} but outs {tuple(outs.shape)} with "
            f"lse_layout={lse_layout!r} needs {expected}"
        )
    if lses.device != outs.device:
        raise ValueError(f"outs is on {outs.device} but lses on {lses.device}")
    out_dtype = outs.dtype if out_dtype is None else out_dtype
    if out_dtype not in _FLOAT_DTYPES:
        raise ValueError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")

    *batch, s, hh, d = outs.shape[1:]
    out = torch.empty((*batch, s, hh, d), dtype=out_dtype, device=outs.device)
    lse = torch.empty(_lse_shape(out.shape, lse_layout), dtype=torch.float32, device=outs.device)
    if out.numel() == 0 and lse.numel() == 0:
        return out, lse
    if s > _MAX_S_HH or hh > _MAX_S_HH:
        raise ValueError(f"S = {s} or Hh = {hh} is over the int32 row index")
    cfg = _pick_config(config, _config)
    nb = len(batch)
    block_d = _next_pow2(max(d, 1))
    bt, bh = _tile(s, hh, block_d, _seq_head_strides(lses, lse_layout)[0], cfg)
    consts = {
        "K": k,
        "BLOCK_T": bt,
        "BLOCK_H": bh,
        "BLOCK_R": bt * bh,
        "BLOCK_D": block_d,
        "EVEN_D": block_d == d,
        "LSE_OUT_HT": lse_layout == "hT",
        "POSINF_IS_EMPTY": posinf_is_empty,
        "ACC_IN_OUT_DTYPE": accumulate == "out_dtype",
        "SKIP_EMPTY_LOADS": cfg.skip_empty_loads,
        "num_warps": cfg.num_warps,
        **_register_cap(cfg),
    }
    n_tiles = _cdiv(s, bt) * _cdiv(hh, bh)

    pair = k == 2 and accumulate == "float32" and cfg.pair_kernel
    if pair:
        consts = {c: v for c, v in consts.items() if c not in _KWAY_ONLY}

    def launch(v: list[torch.Tensor]) -> None:
        o_in, l_in, o_out, l_out = v
        nbv = o_out.dim() - 3
        nbatch = 1
        for n in o_out.shape[:nbv]:
            nbatch *= n
        if nbatch == 0:
            return
        if n_tiles * nbatch > _MAX_GRID:
            raise ValueError(f"{n_tiles * nbatch} tiles is over the launch grid's limit")
        ib = _batch_stride(o_in, 1, nbv)
        lb = _batch_stride(l_in, 1, nbv)
        assert ib is not None and lb is not None
        i_s, i_h = _seq_head_strides(o_in, None)
        l_s, l_h = _seq_head_strides(l_in, lse_layout)
        kernel = _k._merge_pair_kernel if pair else _k._merge_states_kernel
        kernel[(n_tiles * nbatch,)](
            o_out, l_out, o_in, l_in, s, hh, d,
            o_in.stride(0), ib, i_s, i_h,
            l_in.stride(0), lb, l_s, l_h,
            **consts,
        )  # fmt: skip

    # out and lse are fresh and contiguous: any leading selection of them stays so.
    _foreach_batch([outs, lses, out, lse], [1, 1, 0, 0], nb, launch)
    return out, lse


# ---------------------------------------------------------------------------- in-place step


def merge_state_(
    out: torch.Tensor,
    lse: torch.Tensor,
    out_step: torch.Tensor,
    lse_step: torch.Tensor,
    *,
    lse_layout: LseLayout = "hT",
    second_half: bool = False,
    acc: torch.Tensor | None = None,
    posinf_is_empty: bool = True,
    config: MergeConfig | None = None,
    _config: MergeConfig | None = None,
) -> None:
    """Fold one new partial state into an accumulator, in place (one ring-attention step).

    After the call the caller's ``out`` and ``lse`` (same storage, no new tensors) hold the merge
    of their previous contents with ``(out_step, lse_step)``.

    Args:
        out: ``[..., S, Hh, D]`` accumulator output, float16, bfloat16 or float32; updated in
            place. ``D`` must be contiguous; other strides are free.
        lse: the accumulator's log-sum-exp, **natural log**, float32, ``[..., Hh, S]`` ("hT") or
            ``[..., S, Hh]`` ("Th"); updated in place. ``-inf`` (or ``+inf`` with
            ``posinf_is_empty``) marks an empty row: its old ``out`` row is then not read, so an
            accumulator may start as ``torch.empty`` outs with lse filled with ``-inf``.
        out_step: the new partial output ``[..., S', Hh, D]``, float16, bfloat16 or float32,
            with ``S' = S`` or, when ``second_half``, ``S' = S - S // 2``.
        lse_step: its log-sum-exp, natural log, float32, same layout as ``lse`` with ``S'``.
        lse_layout: ``"hT"`` or ``"Th"`` for both ``lse`` and ``lse_step``.
        second_half: update only sequence positions ``S // 2 ..`` of ``out``/``lse`` (and
            ``acc``); positions ``.. S // 2`` are not touched. Ring attention's causal steps
            do this.
        acc: optional float32 ``[..., S, Hh, D]`` accumulator for ``out``. When given it is read
            instead of ``out`` and written in float32, and ``out`` gets its rounded value, so K
            steps lose no precision to ``out``'s dtype. Without it the running sum is rounded
            to ``out``'s dtype at every step.
        posinf_is_empty: read ``lse = +inf`` as ``-inf`` (empty row). Default True.
        config: launch tuning (`MergeConfig`); default ``MergeConfig()``. ``_config`` is its
            deprecated former name.

    Returns:
        None. ``out``, ``lse`` (and ``acc``) hold the result.
    """
    _check_layout(lse_layout)
    _check_out_tensor("out", out)
    _check_out_tensor("out_step", out_step)
    _check_lse_tensor("lse", lse)
    _check_lse_tensor("lse_step", lse_step)
    *batch, s, hh, d = out.shape
    s_step = s - s // 2 if second_half else s
    want_step = (*batch, s_step, hh, d)
    if tuple(out_step.shape) != want_step:
        half = " (second_half: S - S//2 positions)" if second_half else ""
        raise ValueError(
            f"out_step has shape {tuple(out_step.shape)}, expected {want_step}{half} "
            f"for out {tuple(out.shape)}"
        )
    if tuple(lse.shape) != _lse_shape(out.shape, lse_layout):
        raise ValueError(
            f"lse has shape {tuple(lse.shape)} but out {tuple(out.shape)} with "
            f"lse_layout={lse_layout!r} needs {_lse_shape(out.shape, lse_layout)}"
        )
    if tuple(lse_step.shape) != _lse_shape(want_step, lse_layout):
        raise ValueError(
            f"lse_step has shape {tuple(lse_step.shape)}, expected "
            f"{_lse_shape(want_step, lse_layout)} (lse_layout={lse_layout!r})"
        )
    tensors = [out, lse, out_step, lse_step]
    if acc is not None:
        if not isinstance(acc, torch.Tensor) or acc.dtype != torch.float32:
            raise ValueError(f"acc must be a float32 tensor, got {getattr(acc, 'dtype', acc)}")
        if acc.shape != out.shape:
            raise ValueError(f"acc has shape {tuple(acc.shape)}, expected {tuple(out.shape)}")
        if acc.shape[-1] > 1 and acc.stride(-1) != 1:
            raise ValueError(f"acc must be contiguous in its last dim D, got {acc.stride()}")
        tensors.append(acc)
    devs = {t.device for t in tensors}
    if len(devs) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devs))}")
    if out.numel() == 0 and lse.numel() == 0:
        return
    if s > _MAX_S_HH or hh > _MAX_S_HH:
        raise ValueError(f"S = {s} or Hh = {hh} is over the int32 row index")
    cfg = _pick_config(config, _config)
    nb = len(batch)
    s_off = s // 2 if second_half else 0
    block_d = _next_pow2(max(d, 1))
    bt, bh = _tile(s_step, hh, block_d, _seq_head_strides(lse, lse_layout)[0], cfg)
    consts = {
        "BLOCK_T": bt,
        "BLOCK_H": bh,
        "BLOCK_R": bt * bh,
        "BLOCK_D": block_d,
        "EVEN_D": block_d == d,
        "POSINF_IS_EMPTY": posinf_is_empty,
        "HAS_ACC": acc is not None,
        "SKIP_EMPTY_LOADS": cfg.skip_empty_loads,
        "num_warps": cfg.num_warps,
        **_register_cap(cfg),
    }
    n_tiles = _cdiv(s_step, bt) * _cdiv(hh, bh)

    def launch(v: list[torch.Tensor]) -> None:
        o, lo, p, lp = v[:4]
        a = v[4] if len(v) > 4 else o
        nbv = o.dim() - 3
        nbatch = 1
        for n in o.shape[:nbv]:
            nbatch *= n
        if nbatch == 0:
            return
        if n_tiles * nbatch > _MAX_GRID:
            raise ValueError(f"{n_tiles * nbatch} tiles is over the launch grid's limit")
        bs = [_batch_stride(t, 0, nbv) for t in (o, lo, a, p, lp)]
        o_s, o_h = _seq_head_strides(o, None)
        l_s, l_h = _seq_head_strides(lo, lse_layout)
        a_s, a_h = _seq_head_strides(a, None)
        p_s, p_h = _seq_head_strides(p, None)
        q_s, q_h = _seq_head_strides(lp, lse_layout)
        _k._merge_state_inplace_kernel[(n_tiles * nbatch,)](
            o, lo, a, p, lp, s_step, s_off, hh, d,
            bs[0], o_s, o_h, bs[1], l_s, l_h, bs[2], a_s, a_h,
            bs[3], p_s, p_h, bs[4], q_s, q_h,
            **consts,
        )  # fmt: skip

    _foreach_batch(tensors, [0] * len(tensors), nb, launch)


# ---------------------------------------------------------------------------- two-state merge


def merge_state(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
    *,
    lse_layout: LseLayout = "hT",
    posinf_is_empty: bool = True,
    config: MergeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention states into a new one (FlashInfer's ``merge_state``).

    ``lse = log(exp(lse_a) + exp(lse_b))`` and ``out = exp(lse_a - lse) * out_a +
    exp(lse_b - lse) * out_b``, computed in float32 with the exponents shifted by the row's
    larger LSE and rounded once to ``out_a``'s dtype. The inputs are not modified.

    Args:
        out_a: ``[..., S, Hh, D]`` partial output of the first KV segment, float16, bfloat16
            or float32, contiguous in ``D``.
        lse_a: its log-sum-exp, **natural log** (base e), float32, ``[..., Hh, S]`` for
            ``lse_layout="hT"`` (FlashAttention's ``softmax_lse``) or ``[..., S, Hh]`` for
            ``"Th"`` (FlashInfer's ``[seq_len, num_heads]``). An LSE kept in base 2 must be
            multiplied by ln 2 first.
        out_b: the second segment's output, same shape as ``out_a``, any of the float dtypes.
        lse_b: its log-sum-exp, natural log, float32, same shape and layout as ``lse_a``.
        lse_layout: ``"hT"`` (default) or ``"Th"``, for ``lse_a``, ``lse_b`` and the result.
        posinf_is_empty: read ``lse = +inf`` (FlashAttention-2's mark of an empty row) as
            ``-inf``. A state with ``lse = -inf`` is empty and its out row is not read; a row
            empty in both gives out 0 and lse ``-inf``.
        config: launch tuning (`MergeConfig`); default ``MergeConfig()``.

    Returns:
        ``(out, lse)``: out ``[..., S, Hh, D]`` in ``out_a``'s dtype, contiguous; lse float32,
        natural log, contiguous, in ``lse_layout``. The same values as
        ``merge_states([out_a, out_b], [lse_a, lse_b])`` when the two outs share a dtype.

    Cost: one copy of ``out_a`` (and ``lse_a``) and one in-place step (`merge_state_`), which
    moves less than stacking the two states for `merge_states`. In a loop, fold states into one
    accumulator with `merge_state_` instead, or merge K stacked states with `merge_states`.
    """
    _check_layout(lse_layout)
    _check_out_tensor("out_a", out_a)
    _check_lse_tensor("lse_a", lse_a)
    out = out_a.clone(memory_format=torch.contiguous_format)
    lse = lse_a.clone(memory_format=torch.contiguous_format)
    merge_state_(
        out, lse, out_b, lse_b, lse_layout=lse_layout, posinf_is_empty=posinf_is_empty,
        config=config,
    )  # fmt: skip
    return out, lse
