"""The exported model as metatomic defines it: systems and a neighbor list in, an energy
TensorMap out. Engines (ASE, i-PI, LAMMPS, TorchSim) compute the neighbor list, and the
forces, stress and virials by autograd through it."""

# metatomic checks the annotations of forward by their spelling (List[System], not
# list[System]), so this module keeps typing's names and no postponed annotations
# ruff: noqa: UP006, UP035, UP045
from typing import Dict, List, Optional

import torch
from metatensor.torch import Labels, TensorBlock, TensorMap
from metatomic.torch import ModelOutput, NeighborListOptions, System

from .energy_model import EnergyModel


class MetatomicEnergy(torch.nn.Module):
    """The ``energy`` output of an EnergyModel, per system or per atom, for the atoms of
    ``selected_atoms`` (all when None)."""

    def __init__(self, model: EnergyModel):
        super().__init__()
        self.model = model
        # a half list: the model mirrors it, computing each pair's geometry once
        self.neighbors = NeighborListOptions(
            cutoff=model.cutoff, full_list=False, strict=True, requestor="atomtrain"
        )

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:
        return [self.neighbors]

    def forward(
        self,
        systems: List[System],
        outputs: Dict[str, ModelOutput],
        selected_atoms: Optional[Labels] = None,
    ) -> Dict[str, TensorMap]:
        if "energy" not in outputs:
            return {}
        device = systems[0].positions.device
        vectors: List[torch.Tensor] = []
        firsts: List[torch.Tensor] = []
        seconds: List[torch.Tensor] = []
        types: List[torch.Tensor] = []
        starts: List[int] = []
        offset = 0
        for system in systems:
            neighbors = system.get_neighbor_list(self.neighbors)
            pairs = neighbors.samples.values.to(torch.long)
            firsts.append(pairs[:, 0] + offset if offset > 0 else pairs[:, 0])
            seconds.append(pairs[:, 1] + offset if offset > 0 else pairs[:, 1])
            vectors.append(neighbors.values.reshape(-1, 3))
            types.append(system.types.to(torch.long))
            starts.append(offset)
            offset += len(system)
        first = joined(firsts)
        second = joined(seconds)
        atomic = self.model.atomic_energies(
            joined(vectors),
            torch.cat([first, second]),
            torch.cat([second, first]),
            joined(types),
            True,
        )
        per_atom = outputs["energy"].sample_kind == "atom"
        if len(systems) == 1 and selected_atoms is None and not per_atom:
            # what an MD engine asks at every step: a dozen operations fewer
            total = Labels(["system"], torch.zeros((1, 1), dtype=torch.int32, device=device))
            return energy_map(atomic.sum().reshape(1, 1), total)
        first_atoms = torch.tensor(starts, dtype=torch.long, device=device)
        counts = torch.tensor([len(system) for system in systems], device=device)
        systems_of_atoms = torch.repeat_interleave(
            torch.arange(len(systems), device=device), counts
        )
        atoms = torch.arange(offset, device=device) - first_atoms.index_select(0, systems_of_atoms)
        if selected_atoms is not None:
            chosen = selected_atoms.values.to(torch.long)
            kept = first_atoms.index_select(0, chosen[:, 0]) + chosen[:, 1]
            atomic = atomic.index_select(0, kept)
            systems_of_atoms = systems_of_atoms.index_select(0, kept)
            atoms = atoms.index_select(0, kept)
        if per_atom:
            values = atomic.reshape(-1, 1)
            samples = Labels(
                ["system", "atom"], torch.stack([systems_of_atoms, atoms], dim=1).to(torch.int32)
            )
        else:
            energy = torch.zeros(len(systems), dtype=atomic.dtype, device=device)
            values = energy.index_add(0, systems_of_atoms, atomic).reshape(-1, 1)
            samples = Labels(
                ["system"],
                torch.arange(len(systems), dtype=torch.int32, device=device).reshape(-1, 1),
            )
        return energy_map(values, samples)


def joined(tensors: List[torch.Tensor]) -> torch.Tensor:
    """torch.cat, without its copy for a single tensor (one system, every MD step)."""
    if len(tensors) == 1:
        return tensors[0]
    return torch.cat(tensors)


def energy_map(values: torch.Tensor, samples: Labels) -> Dict[str, TensorMap]:
    """The ``energy`` output: one block of ``values`` [samples, 1]."""
    device = values.device
    block = TensorBlock(
        values=values,
        samples=samples,
        components=[],
        properties=Labels(["energy"], torch.zeros((1, 1), dtype=torch.int32, device=device)),
    )
    keys = Labels(["_"], torch.zeros((1, 1), dtype=torch.int32, device=device))
    return {"energy": TensorMap(keys, [block])}
