"""Fine-tuning's ``heads`` and ``lora`` methods: only the heads and last layers, or only
low-rank adapters on the linear maps (models/adapters.py), train; every other parameter
stays as the pretrained model has it (``requires_grad`` off, so the optimizer never
holds it and no process sums its gradient).

The modules are given as name patterns of the model's parameters (fnmatch; a module
stands for every parameter under it), in atomtrain's names ("mace.readouts") or in
metatrain's, relative to the architecture's network ("node_heads", or
"backend.node_heads" as metatrain's PET names it). atomtrain's own heads (of mtt::
targets and energy variants) always train.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from fnmatch import fnmatch

from ..errors import OptionsError
from ..models import adapters
from ..models.architecture import Architecture
from ..models.energy_model import EnergyModel
from ..options import Options
from .outputs import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)

OWN_HEADS = ("heads", "variant_heads")
METATRAIN_NETWORK = "backend."


def matches(name: str, pattern: str) -> bool:
    return fnmatch(name, pattern) or fnmatch(name, pattern + ".*")


def spellings(pattern: str, architecture: Architecture) -> list[str]:
    """A pattern as given, and under the architecture's network."""
    inner = pattern.removeprefix(METATRAIN_NETWORK)
    return [pattern, architecture.module_prefix + inner]


def modules_of(names: list[str]) -> list[str]:
    """The model's modules two levels down, for a message."""
    found: list[str] = []
    for name in names:
        module = ".".join(name.split(".")[:2])
        if module not in found:
            found.append(module)
    return found


def freeze_for_method(model: EnergyModel, architecture: Architecture, options: Options) -> None:
    finetune = options.architecture.training.finetune
    if finetune is None or finetune.method == "full":
        return
    if finetune.method == "lora":
        train_adapters(model, architecture, options)
        return
    key = "architecture.training.finetune.config"
    if architecture.head_modules is None:
        raise OptionsError(
            f"architecture.training.finetune.method: heads is not offered for "
            f"{architecture.name}; use method: full"
        )
    config = finetune.config
    given = [*(config.head_modules or []), *(config.last_layer_modules or [])]
    patterns = given or list(architecture.head_modules(options.architecture.model))
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(matches(name, s) for name in names for s in spellings(pattern, architecture)):
            raise OptionsError(
                f"{key}: '{pattern}' names no module of this {architecture.display_name} "
                f"model; its modules: {', '.join(modules_of(names))}"
            )
    patterns = [s for pattern in patterns for s in spellings(pattern, architecture)]
    trained, total = train_only(
        model, lambda name: any(matches(name, pattern) for pattern in patterns)
    )
    chosen = ", ".join(given) if given else "the architecture's heads"
    logger.info(
        f"fine-tuning method heads: {trained} of {total} parameters train ({chosen}); the "
        "others stay as the pretrained model has them"
    )


def train_adapters(model: EnergyModel, architecture: Architecture, options: Options) -> None:
    """Adapters on the model (unless it has them: a resumed run's model is built with
    them), and only they (and atomtrain's own heads) train."""
    config = options.architecture.training.finetune.config
    if "adapters" not in model.hypers:
        targets = tuple(config.target_modules or architecture.lora_targets)
        dtype = next(model.parameters()).dtype
        inject = architecture.inject_adapters
        if adapters.attach(model, inject, config.rank, config.alpha, targets) == 0:
            raise OptionsError(
                "architecture.training.finetune.config.target_modules: "
                f"{', '.join(targets)} names no linear map of this "
                f"{architecture.display_name} model; lora adapts linear maps"
            )
        model.set_precision(dtype)
    trained, total = train_only(model, adapters.is_adapter)
    lora = model.hypers["adapters"]
    logger.info(
        f"fine-tuning method lora: adapters of rank {lora['rank']} (alpha {lora['alpha']:g}) "
        f"on {', '.join(lora['targets'])}: {trained} of {total} parameters train; the "
        "exported model has them merged"
    )


def train_only(model: EnergyModel, trains: Callable[[str], bool]) -> tuple[int, int]:
    """Only the parameters whose names ``trains`` picks, and atomtrain's own heads,
    train; (how many numbers train, how many the model has)."""
    trained = 0
    for name, parameter in model.named_parameters():
        own_head = any(matches(name, pattern) for pattern in OWN_HEADS)
        parameter.requires_grad_(trains(name) or own_head)
        trained += parameter.numel() if parameter.requires_grad else 0
    return trained, sum(parameter.numel() for parameter in model.parameters())
