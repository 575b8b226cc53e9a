"""What every op runtime shares: dtype names as torch dtypes and seeded generators."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}

Tensors = dict[str, torch.Tensor]


def generator(seed: int, device: torch.device, salt: int = 0) -> torch.Generator:
    """A torch generator on `device` seeded from (seed, salt): one stream per input tensor so
    that adding an input never shifts the values of the others."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + salt) % (2**63 - 1))
    return g
