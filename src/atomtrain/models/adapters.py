"""Low-rank adapters (LoRA) on a model's linear maps, for fine-tuning's ``lora`` method:
``W x + b`` becomes ``(W + (alpha / rank) B A) x + b`` with A [rank, in] small and
random, B [out, rank] zero (the model starts as it was), and only A and B train.

A checkpoint holds W, A and B apart, and the model's hyperparameter record names the
adapters (``hypers["adapters"]``), so that it is built again with them and training
resumes; the exported model has them merged, ``W + (alpha / rank) B A``, and is the
plain architecture to engines (:func:`merged`).

This is the adapter for ``torch.nn.Linear`` (SOAP-BPNN's networks, PET's layers); MACE
uses mace-torch's own, which also adapts e3nn's equivariant linear maps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from fnmatch import fnmatch

import torch

ADAPTER_PARAMETERS = ("lora_A", "lora_B")


class LowRankLinear(torch.nn.Module):
    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.scaling = float(alpha) / float(rank)
        weight = base.weight
        self.lora_A = torch.nn.Parameter(torch.empty(rank, base.in_features).to(weight))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank).to(weight))
        with torch.no_grad():
            torch.nn.init.normal_(self.lora_A, mean=0.0, std=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.base.weight + self.scaling * (self.lora_B @ self.lora_A)
        return torch.nn.functional.linear(x, weight, self.base.bias)

    def merged(self) -> torch.nn.Linear:
        with torch.no_grad():
            self.base.weight.add_(self.scaling * (self.lora_B @ self.lora_A))
        return self.base


def chosen(qualified_name: str, targets: tuple[str, ...]) -> bool:
    """A linear map is adapted when its name, or the last part of it (metatrain's
    ``input_linear``), matches a target pattern."""
    last = qualified_name.rsplit(".", 1)[-1]
    return any(fnmatch(qualified_name, target) or fnmatch(last, target) for target in targets)


def inject_linear(model: torch.nn.Module, rank: int, alpha: float, targets: tuple[str, ...]) -> int:
    """Adapters on the torch.nn.Linear maps ``targets`` choose; how many."""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and chosen(name, targets)
    ]
    for name, module in found:
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attribute, LowRankLinear(module, rank, alpha))
    return len(found)


def merge_linear(model: torch.nn.Module) -> None:
    for name, module in list(model.named_modules()):
        if isinstance(module, LowRankLinear):
            parent_name, _, attribute = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, attribute, module.merged())


def is_adapter(name: str) -> bool:
    return any(part in name for part in ADAPTER_PARAMETERS)


def attach(
    model: torch.nn.Module,
    inject: Callable[[torch.nn.Module, int, float, tuple[str, ...]], int],
    rank: int,
    alpha: float,
    targets: tuple[str, ...],
) -> int:
    """Adapters on ``model`` by the architecture's ``inject``, named in its
    hyperparameter record so that it is built again with them; how many."""
    count = inject(model, rank, alpha, targets)
    record = {"rank": rank, "alpha": alpha, "targets": list(targets)}
    model.hypers = {**model.hypers, "adapters": record}
    return count


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with its adapters merged into the maps they adapt, and a
    hyperparameter record without them: the plain architecture, for export."""
    from . import registry

    hypers = getattr(model, "hypers", {})
    if "adapters" not in hypers:
        return model
    copied = copy.deepcopy(model)
    registry.architecture_of(hypers).merge_adapters(copied)
    copied.hypers = {key: value for key, value in hypers.items() if key != "adapters"}
    return copied
