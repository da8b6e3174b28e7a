"""An ASE calculator for exported atomtrain models: ``Calculator("model.pt")``."""

from __future__ import annotations

import json
import warnings

import numpy as np
import torch
from ase.calculators.calculator import Calculator as AseCalculator
from ase.calculators.calculator import all_changes

from .data.neighbors import compute_neighbor_list
from .errors import AtomtrainError
from .models.composition import (
    composition_counts,
    incomplete_span,
    outside_span,
    undetermined_note,
)
from .models.export import (
    BASELINE_SPAN_FILE,
    HYPERS_FILE,
    learnt_targets,
    load_exported,
    unspecialized_on_cpu,
)
from .targets import NON_CONSERVATIVE_FORCE, NON_CONSERVATIVE_STRESS, TargetSpec


class Calculator(AseCalculator):
    """Energy, free energy, forces and (for periodic structures) stress from an
    exported model file. Units are eV and angstrom, as ASE expects. A model's mtt::
    targets are in ``results`` too, under their names, in the file's layout and units:
    ``calc.results["mtt::dipole"]`` ([subtargets], [3, subtargets], [3, 3, subtargets]
    or [components, subtargets]; per atom, with a first axis over the atoms), computed
    with every energy calculation (``calc.get_property("mtt::dipole", atoms)``)."""

    def __init__(
        self,
        model_path: str,
        device: str = "cpu",
        threads: int | None = 1,
        variant: str | None = None,
        non_conservative: bool = False,
        **kwargs,
    ):
        """``threads``: torch's threads in this process (``torch.set_num_threads``, set
        once here), or None to leave torch's setting. One thread is the default: it was
        the fastest measured on CPU from 9 to 1,701 atoms on an idle machine, and beside
        another job several threads were up to 3.6x slower (docs/performance-notes.md, "A busy
        machine"). Changing the count around every call instead cost more than it saved
        on a busy machine (torch resizes a thread pool each time). ``variant``: which
        energy of a model trained on several ("r2scan" for energy/r2scan; unset:
        "energy", or the model's only one). ``non_conservative``: forces (less their net
        force) and stress from the model's direct outputs (its non_conservative_force and
        non_conservative_stress targets), without a backward pass, as metatomic-ase's
        ``non_conservative=True``."""
        super().__init__(**kwargs)
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        stored = {HYPERS_FILE: "", BASELINE_SPAN_FILE: ""}
        self.model = load_exported(model_path, self.device, stored)
        records = json.loads(stored[HYPERS_FILE] or "{}").get("targets", {}).get("others", [])
        self.dtype = next(self.model.parameters()).dtype
        self.cutoff = float(self.model.cutoff)
        self.atomic_types = set(int(z) for z in self.model.atomic_types)
        # the compositions whose energies the training data determined; None: all
        span = json.loads(stored[BASELINE_SPAN_FILE] or "null")
        self.span = incomplete_span(span, len(self.atomic_types))
        energies, self.targets = learnt_targets(self.model)
        self.learns_energy = len(energies) > 0
        self.energy_variant = chosen_energy(energies, variant, model_path)
        self.target_shapes = {
            record["name"]: TargetSpec.from_record(record).shape_in_file() for record in records
        }
        self.implemented_properties = [
            *(["energy", "free_energy", "forces", "stress"] if self.learns_energy else []),
            *(name for name, _ in self.targets),
        ]
        self.non_conservative = non_conservative
        learnt = [name for name, _ in self.targets]
        # without a direct stress, the stress by autograd (as metatomic-ase's "forces")
        self.direct_stress = non_conservative and NON_CONSERVATIVE_STRESS in learnt
        if non_conservative and NON_CONSERVATIVE_FORCE not in learnt:
            raise AtomtrainError(
                f"{model_path} has no direct forces ({NON_CONSERVATIVE_FORCE}); train it with "
                "a non_conservative_forces target, or leave out non_conservative"
            )

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        unknown = sorted(set(int(z) for z in atoms.numbers) - self.atomic_types)
        if unknown:
            raise AtomtrainError(
                f"the model was not trained on atomic numbers {unknown}; it knows "
                f"{sorted(self.atomic_types)}"
            )
        self.warn_if_undetermined(atoms.numbers)
        pbc = np.asarray(atoms.pbc, dtype=bool)
        first, second, shifts = compute_neighbor_list(
            atoms.positions, atoms.cell.array, pbc, self.cutoff
        ).full()
        compute_stress = bool(pbc.all()) and self.learns_energy
        compute_forces = self.learns_energy and not self.non_conservative

        def tensor(value, dtype=None):
            return torch.as_tensor(value, dtype=dtype or self.dtype, device=self.device)

        with unspecialized_on_cpu(self.device):
            outputs = self.model(
                positions=tensor(atoms.positions),
                cell=tensor(atoms.cell.array).reshape(1, 3, 3),
                atomic_numbers=tensor(atoms.numbers, torch.long),
                system_index=torch.zeros(len(atoms), dtype=torch.long, device=self.device),
                pair_first=first.to(self.device),
                pair_second=second.to(self.device),
                cell_shifts=tensor(shifts),
                periodic=tensor([bool(pbc.any())], torch.bool),
                compute_forces=compute_forces,
                compute_stress=compute_stress and not self.direct_stress,
                create_graph=False,
                **(
                    {"energy_variant": torch.tensor([self.energy_variant], device=self.device)}
                    if self.energy_variant
                    else {}
                ),
            )
        for name, per_atom in self.targets:
            values = outputs[name].detach().cpu().numpy().astype(np.float64)
            shape = self.target_shapes[name]
            self.results[name] = values.reshape((len(atoms), *shape) if per_atom else shape)
        if not self.learns_energy:
            return
        energy = float(outputs["energy"].detach().cpu()[0])
        self.results["energy"] = energy
        self.results["free_energy"] = energy
        forces = outputs["forces"] if compute_forces else outputs[NON_CONSERVATIVE_FORCE]
        if not compute_forces:
            forces = forces - forces.mean(dim=0, keepdim=True)  # no net force
        self.results["forces"] = forces.detach().cpu().numpy().astype(np.float64)
        if compute_stress:
            stress = outputs[NON_CONSERVATIVE_STRESS if self.direct_stress else "stress"]
            stress = stress.detach().cpu().numpy()[0].astype(np.float64)
            self.results["stress"] = stress.reshape(9)[[0, 4, 8, 5, 2, 1]]

    def warn_if_undetermined(self, numbers: np.ndarray) -> None:
        """Warn once per calculator at a composition whose per-element energies the
        training data left undetermined."""
        if self.span is None:
            return
        counts = composition_counts(
            torch.as_tensor(numbers, dtype=torch.long),
            torch.zeros(len(numbers), dtype=torch.long),
            1,
            sorted(self.atomic_types),
        )
        if bool(outside_span(self.span, counts)[0]):
            warnings.warn(undetermined_note("this structure has"), stacklevel=3)
            self.span = None  # once


def chosen_energy(energies: list[str], variant: str | None, model_path: str) -> int:
    """The position of the energy a calculator gives among the model's ``energies``."""
    if variant is None:
        if len(energies) <= 1 or "energy" in energies:
            return energies.index("energy") if "energy" in energies else 0
        raise AtomtrainError(
            f"{model_path} has several energies ({', '.join(energies)}) and none is plain "
            "'energy': choose one with Calculator(..., variant=NAME)"
        )
    name = variant if variant.startswith("energy") else f"energy/{variant}"
    if name not in energies:
        raise AtomtrainError(
            f"{model_path} has no energy '{name}'; it has {', '.join(energies) or 'none'}"
        )
    return energies.index(name)
