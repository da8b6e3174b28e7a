"""Learning rate: linear warmup, then cosine decay to zero."""

from __future__ import annotations

import math

import torch


def warmup_cosine(total_steps: int, warmup_fraction: float):
    warmup_steps = int(warmup_fraction * total_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def make_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, warmup_fraction))
