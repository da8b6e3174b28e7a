"""Fine-tuning to targets a pretrained model lacks: new heads beside its own, started
from scratch or from one of its heads (metatrain's ``inherit_heads``)."""

from __future__ import annotations

import logging

from ..errors import OptionsError
from ..models.energy_model import EnergyModel
from ..targets import TargetSpec
from .outputs import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)


def same_layout(first: TargetSpec, second: TargetSpec) -> bool:
    """Whether two targets' heads are alike (the file key aside)."""
    return first.record() | {"key": "", "name": ""} == second.record() | {"key": "", "name": ""}


def check_inheritance(
    inherit: dict[str, str], added: set[str], specs: dict[str, TargetSpec], energies: list[str]
) -> None:
    for new, old in inherit.items():
        where = f"architecture.training.finetune.inherit_heads.{new}"
        if new not in added:
            raise OptionsError(
                f"{where}: '{new}' is not a target this run adds to the pretrained model (it "
                f"adds {sorted(added) or 'none'}); inherit_heads starts new heads only"
            )
        if new.startswith("energy"):
            if old not in energies:
                raise OptionsError(
                    f"{where}: the pretrained model has no energy '{old}' (it has "
                    f"{', '.join(energies) or 'none'})"
                )
        elif old not in specs:
            raise OptionsError(
                f"{where}: the pretrained model has no target '{old}' (it has "
                f"{', '.join(specs) or 'none'})"
            )
        elif not same_layout(specs[old], specs[new]):
            raise OptionsError(
                f"{where}: '{old}' and '{new}' differ in type, per_atom or num_subtargets; "
                "a head can start only from one of the same kind"
            )


def extend_heads(
    model: EnergyModel,
    specs: list[TargetSpec],
    energy_names: list[str],
    inherit: dict[str, str],
) -> set[str]:
    """Give ``model`` heads for the targets and energies a fine-tuning run names that it
    lacks, keeping its own; returns the names added."""
    known = {spec.name: spec for spec in model.target_specs()}
    for spec in specs:
        if spec.name in known and not same_layout(known[spec.name], spec):
            raise OptionsError(
                f"training_set: {spec.name} differs from the pretrained model's target of "
                "that name (type, per_atom or num_subtargets); name the new one otherwise"
            )
    energies = list(model.energy_names)
    new_energies = [name for name in energy_names if name not in energies]
    new_specs = [spec for spec in specs if spec.name not in known]
    added = {*new_energies, *(spec.name for spec in new_specs)}
    check_inheritance(inherit, added, {**known, **{s.name: s for s in new_specs}}, energies)
    if not added:
        return added
    old_heads = dict(zip(model.target_names, model.heads))
    old_variants = dict(zip(energies[1:], model.variant_heads))
    relative = list(model.variant_relative)
    if not energies:  # a model without energy: the first energy named is its own
        energies, new_energies = new_energies[:1], new_energies[1:]
    relative += [inherit.get(name) == energies[0] for name in new_energies]
    model.attach_targets([*known.values(), *new_specs], energies + new_energies, relative)
    for name, head in zip(model.target_names, model.heads):
        source = old_heads.get(name) or old_heads.get(inherit.get(name, ""))
        if source is not None:
            head.load_state_dict(source.state_dict())
    main_scale = float(model.scale)
    for index, (name, head) in enumerate(zip(model.energy_names[1:], model.variant_heads)):
        source = old_variants.get(name) or old_variants.get(inherit.get(name, ""))
        if source is not None:
            head.load_state_dict(source.state_dict())
        elif model.variant_relative[index] and name in new_energies:
            head.scale.fill_(main_scale)  # a difference of the energy's order
    described = ", ".join(
        f"{name} (from {inherit[name]})" if name in inherit else name for name in sorted(added)
    )
    logger.info(f"fine-tuning adds heads for {described}")
    return added


def heads_to_fit(model: EnergyModel, added: set[str], inherit: dict[str, str]) -> set[str]:
    """The added heads whose baselines are fitted to this run's data: those not started
    from another head (a relative variant's is fitted to its difference)."""
    relative = {
        name
        for name, flag in zip(model.energy_names[1:], model.variant_relative)
        if flag and name in added
    }
    return {name for name in added if name not in inherit} | relative
