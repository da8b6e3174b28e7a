"""An exponential moving average (EMA) of the trained weights, as mace_run_train's
``--ema`` keeps one (torch_ema's rule): after every optimizer step,

    average <- d * average + (1 - d) * weights,   d = min(ema_decay, (1 + n) / (10 + n))

with n the steps averaged so far, so that the first steps are not held back by the
random start. Validation, the choice of the best model and the export use the average;
training goes on from the weights themselves. Every rank holds the same weights, so
every rank computes the same average: N processes give the one-process average, and the
checkpoint holds it (with n) for an exact resume.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch


class WeightAverage:
    def __init__(self, parameters: Sequence[torch.nn.Parameter], decay: float):
        self.parameters = list(parameters)
        self.decay = decay
        self.updates = 0
        self.averages = [parameter.detach().clone() for parameter in self.parameters]

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for average, parameter in zip(self.averages, self.parameters):
            average.lerp_(parameter.detach(), 1.0 - decay)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The model's parameters hold the average inside the block, their own values
        again after it."""
        kept = [parameter.detach().clone() for parameter in self.parameters]
        self.copy_into_parameters(self.averages)
        try:
            yield
        finally:
            self.copy_into_parameters(kept)

    @torch.no_grad()
    def copy_into_parameters(self, values: Sequence[torch.Tensor]) -> None:
        for parameter, value in zip(self.parameters, values):
            parameter.copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {
            "decay": self.decay,
            "updates": self.updates,
            "averages": [average.detach().cpu() for average in self.averages],
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        for average, saved in zip(self.averages, state["averages"]):
            average.copy_(saved)
