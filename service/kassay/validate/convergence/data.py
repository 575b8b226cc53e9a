"""The convergence check's language: deterministic, synthetic, shipped with kassay (no tokenizer,
nothing downloaded), with a known entropy floor and a half that only attention across the
context-parallel split can predict.

A sequence of `seq` tokens over `vocab` symbols: its first half walks a fixed Markov chain (each
row of the transition matrix puts its mass on `branch` successors, so every step carries
log(branch)-ish nats the model cannot remove); its second half copies the first. Predicting
token t + 1 from tokens <= t: the first half's targets cost the chain's entropy at best, the
copied half nothing once the model has learned to look back half a sequence, across the chunks
its attention is split into. The floor (`entropy_floor`) is what a perfect model reaches.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

#: the chain's seed: one language for every job, seed and impl
LANGUAGE_SEED = 20261205


@dataclass(frozen=True)
class Language:
    vocab: int
    seq: int
    branch: int = 4

    @functools.cached_property
    def transitions(self) -> torch.Tensor:
        """[vocab, vocab] float64 row-stochastic: `branch` successors per symbol, with fixed
        unequal weights (so the floor is not log(branch) exactly). Built once per Language."""
        g = torch.Generator().manual_seed(LANGUAGE_SEED)
        weights = torch.tensor([0.4, 0.3, 0.2, 0.1][: self.branch], dtype=torch.float64)
        weights = weights / weights.sum()
        p = torch.zeros(self.vocab, self.vocab, dtype=torch.float64)
        for s in range(self.vocab):
            succ = torch.randperm(self.vocab, generator=g)[: self.branch]
            p[s, succ] = weights
        return p

    def entropy_floor(self) -> float:
        """Mean nats per target of a perfect model: the chain's conditional entropy on the
        first half's targets (seq/2 - 1 of the seq - 1), zero on the copied half."""
        p = self.transitions
        row = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(dim=1)
        # the chain starts uniform; its rows all have the same entropy
        h = float(row.mean())
        half = self.seq // 2
        return h * (half - 1) / (self.seq - 1)

    def batch(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """[n, seq] int64 sequences (on the CPU; move them where the model is)."""
        p = self.transitions
        half = self.seq // 2
        first = torch.empty(n, half, dtype=torch.int64)
        first[:, 0] = torch.randint(0, self.vocab, (n,), generator=generator)
        for t in range(1, half):
            first[:, t] = torch.multinomial(p[first[:, t - 1]], 1, generator=generator)[:, 0]
        return torch.cat([first, first], dim=1)[:, : self.seq]


@functools.lru_cache(maxsize=4)
def held_out(vocab: int, seq: int, n: int) -> torch.Tensor:
    """[n, seq] int64 on the CPU: the fixed held-out set every arm and seed is evaluated on
    (made once per process; callers copy it to their device and never write it)."""
    return Language(vocab, seq).batch(n, torch.Generator().manual_seed(LANGUAGE_SEED + 1))


def uniform_loss(vocab: int) -> float:
    """What a model that learned nothing scores (nats per target)."""
    return math.log(vocab)
