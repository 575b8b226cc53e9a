"""The convergence check's model: a small decoder-only transformer in plain torch (root-mean-square norm, RoPE,
SwiGLU), its attention split into context-parallel chunks on one device, with two places an op
under test takes over (kassay.ops' `convergence_module`):

- `merge` (lse_merge): each layer's attention is computed per chunk of keys (causal, a chunk
  wholly in a query's future is an empty state: out 0, lse -inf) and the chunks' states are
  merged by the impl, as ring attention merges what each context-parallel rank computed;
- `head` (flce): the LM head and its loss, x @ W^T -> cross-entropy over the vocabulary.

Left as None, each takes the float32 torch formula; evaluation always runs with both (the
reference head and merge), so a held-out loss measures the weights an impl trained, not its
forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: (outs [K, N, h, hd], lses [K, h, N]) -> out [N, h, hd]
Merge = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: (hidden [N, d], weight [V, d], target [N]) -> mean loss (a 0-dim tensor)
Head = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Shape:
    """The model's shape: ConvergencePolicy.shape() (its defaults live there)."""

    vocab: int
    dim: int
    heads: int
    layers: int
    seq: int
    batch: int
    chunks: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def reference_merge(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """The float32 K-way merge, differentiable; rows empty in every state give 0."""
    lse = lses.transpose(1, 2)  # [K, N, h]
    m = lse.max(dim=0).values
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m)
    s = w.sum(dim=0)
    coef = w / torch.where(s > 0, s, torch.ones_like(s))
    return (coef[..., None] * outs).sum(dim=0)


def reference_head(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(hidden.float() @ weight.float().t(), target)


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on [B, T, h, hd]."""
    _, t, _, hd = x.shape
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        d, f = shape.dim, 4 * shape.dim
        self.shape = shape
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, f, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def attention(self, x: torch.Tensor, merge: Merge) -> torch.Tensor:
        """Causal attention over `chunks` chunks of keys, merged by `merge`."""
        b, t, d = x.shape
        h, hd, k = self.shape.heads, self.shape.head_dim, self.shape.chunks
        q, kk, v = self.qkv(x).view(b, t, 3, h, hd).unbind(dim=2)
        q, kk = _rope(q), _rope(kk)
        step = t // k
        pos = torch.arange(t, device=x.device)
        outs, lses = [], []
        for c in range(k):
            keys = slice(c * step, t if c == k - 1 else (c + 1) * step)
            s = torch.einsum("bqhd,bkhd->bhqk", q, kk[:, keys]) / math.sqrt(hd)
            mask = pos[keys][None, :] > pos[:, None]  # [q, k]: a key in the query's future
            s = s.masked_fill(mask, -math.inf)
            lse = torch.logsumexp(s, dim=-1)  # [b, h, q]: -inf where the chunk is all future
            safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
            p = torch.exp(s - safe[..., None])
            o = torch.einsum("bhqk,bkhd->bqhd", p, v[:, keys])
            outs.append(o.reshape(b * t, h, hd))
            lses.append(lse.permute(1, 0, 2).reshape(h, b * t))
        out = merge(torch.stack(outs), torch.stack(lses))  # [b*t, h, hd]
        return self.proj(out.reshape(b, t, d))

    def forward(self, x: torch.Tensor, merge: Merge) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), merge)
        y = self.norm2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Decoder(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.dim)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.dim)
        self.head = nn.Parameter(torch.randn(shape.vocab, shape.dim) / math.sqrt(shape.dim))

    def loss(
        self, tokens: torch.Tensor, merge: Merge | None = None, head: Head | None = None
    ) -> torch.Tensor:
        """Mean next-token cross-entropy of tokens [B, T] (targets: tokens 1..T-1; the last
        position predicts nothing)."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, merge or reference_merge)
        hidden = self.norm(x)[:, :-1].reshape(-1, self.shape.dim)
        target = tokens[:, 1:].reshape(-1)
        return (head or reference_head)(hidden, self.head, target)
