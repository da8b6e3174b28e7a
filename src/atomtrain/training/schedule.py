"""Learning rate: linear warmup, then a cosine decay to zero or a constant rate."""

from __future__ import annotations

import math

import torch


def warmup_then(total_steps: int, warmup_fraction: float, after: str):
    """The factor of the learning rate at each step: linear warmup, then ``after``
    ("cosine": down to zero at the last step; "constant": one)."""
    warmup_steps = int(warmup_fraction * total_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if after == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def make_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float, after: str
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_then(total_steps, warmup_fraction, after)
    )
