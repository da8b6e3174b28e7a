"""The optimizer and its learning rate: a linear warmup, then a cosine decay to zero, a
constant rate, an exponential decay per epoch, or a rate lowered when validation stops
improving (mace_run_train's and metatrain's MACE schedules, by their names)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..options import TrainingOptions

# torch's ReduceLROnPlateau default: an improvement is a relative drop of more than this
RELATIVE_THRESHOLD = 1e-4


@dataclass
class Plateau:
    """ReduceLROnPlateau's rule (mode min, relative threshold, no cooldown), fed with the
    validation error that picks the best model: every rank gets the same global value,
    so every rank lowers the rate at the same step. Checkpointed with the run."""

    factor: float
    patience: int
    scale: float = 1.0
    best: float = math.inf
    bad_validations: int = 0

    def validated(self, metric: float) -> bool:
        """Count one validation; True when it lowers the rate."""
        if metric < self.best * (1 - RELATIVE_THRESHOLD):
            self.best, self.bad_validations = metric, 0
            return False
        self.bad_validations += 1
        if self.bad_validations <= self.patience:
            return False
        self.scale *= self.factor
        self.bad_validations = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.best = float(state["best"])
        self.bad_validations = int(state["bad_validations"])


def warmup_then(
    total_steps: int,
    warmup_fraction: float,
    after: str,
    steps_per_epoch: int = 1,
    gamma: float = 1.0,
    plateau: Plateau | None = None,
):
    """The factor of the learning rate at each step: linear warmup, then ``after``:
    "cosine", down to zero at the last step; "constant", one; "ExponentialLR",
    ``gamma`` to the power of the epoch; "ReduceLROnPlateau", the plateau's scale."""
    warmup_steps = int(warmup_fraction * total_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if after == "constant":
            return 1.0
        if after == "ExponentialLR":
            return gamma ** (step // steps_per_epoch)
        if after == "ReduceLROnPlateau":
            assert plateau is not None
            return plateau.scale
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    training: TrainingOptions,
    steps_per_epoch: int,
    plateau: Plateau,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The training section's schedule over its epochs of ``steps_per_epoch`` steps."""
    factor = warmup_then(
        training.num_epochs * steps_per_epoch,
        training.warmup_fraction,
        training.lr_scheduler,
        steps_per_epoch,
        training.lr_scheduler_gamma,
        plateau,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def apply_now(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set the rate of the next step from the schedule as it stands (after a plateau
    lowered it: LambdaLR would otherwise apply it one step late)."""
    for group, base, factor in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas
    ):
        group["lr"] = base * factor(scheduler.last_epoch)


def _undecorated(method: Callable[..., Any]) -> Callable[..., Any]:
    # every layer: torch also wraps a class's step in its profiling hooks once an
    # instance of it exists (Optimizer._patch_step_function)
    return inspect.unwrap(method)


def _eager(kind: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``kind`` without torch's guards against ``torch.compile`` tracing into the
    optimizer. Each of them imports torch._dynamo on its first call: 0.9-1.5 s of every
    run's start, for a guard that never acts here, since atomtrain compiles the
    predictions and never the optimizer. The step keeps what its guard did besides:
    no autograd graph through the update (torch's ``differentiable=False``)."""
    step = _undecorated(kind.step)

    class Eager(kind):  # type: ignore[valid-type, misc]
        add_param_group = _undecorated(torch.optim.Optimizer.add_param_group)
        zero_grad = _undecorated(torch.optim.Optimizer.zero_grad)
        state_dict = _undecorated(torch.optim.Optimizer.state_dict)
        load_state_dict = _undecorated(torch.optim.Optimizer.load_state_dict)

        @torch.no_grad()
        def step(self, closure=None):  # type: ignore[no-untyped-def]
            return step(self, closure)

    Eager.__name__ = Eager.__qualname__ = kind.__name__
    return Eager


EAGER_ADAM = _eager(torch.optim.Adam)
EAGER_ADAMW = _eager(torch.optim.AdamW)


def make_optimizer(
    parameters: list[tuple[str, torch.nn.Parameter]],
    training: TrainingOptions,
    decays: Callable[[str], bool] = lambda name: True,
) -> torch.optim.Optimizer:
    """Adam or AdamW as the training section sets them; weight decay only on the
    parameters ``decays`` names (the architecture's choice), the others in a group of
    their own."""
    kind = EAGER_ADAMW if training.optimizer == "adamw" else EAGER_ADAM
    decayed = [parameter for name, parameter in parameters if decays(name)]
    spared = [parameter for name, parameter in parameters if not decays(name)]
    groups = [{"params": decayed}] if decayed else []
    if spared:
        groups.append({"params": spared, "weight_decay": 0.0})
    return kind(
        groups,
        lr=training.learning_rate,
        betas=(training.beta, 0.999),
        weight_decay=training.weight_decay,
        amsgrad=training.amsgrad,
        fused=True,
    )
