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
        system_index: List[torch.Tensor] = []
        atom_index: List[torch.Tensor] = []
        offsets: List[int] = []
        offset = 0
        for number, system in enumerate(systems):
            neighbors = system.get_neighbor_list(self.neighbors)
            pairs = neighbors.samples.values
            firsts.append(pairs[:, 0].to(torch.long) + offset)
            seconds.append(pairs[:, 1].to(torch.long) + offset)
            vectors.append(neighbors.values.reshape(-1, 3))
            types.append(system.types.to(torch.long))
            n_atoms = len(system)
            system_index.append(torch.full((n_atoms,), number, dtype=torch.long, device=device))
            atom_index.append(torch.arange(n_atoms, dtype=torch.long, device=device))
            offsets.append(offset)
            offset += n_atoms
        first = torch.cat(firsts)
        second = torch.cat(seconds)
        atomic = self.model.atomic_energies(
            torch.cat(vectors),
            torch.cat([first, second]),
            torch.cat([second, first]),
            torch.cat(types),
            True,
        )
        systems_of_atoms = torch.cat(system_index)
        atoms = torch.cat(atom_index)
        if selected_atoms is not None:
            chosen = selected_atoms.values.to(torch.long)
            starts = torch.tensor(offsets, dtype=torch.long, device=device)
            kept = starts.index_select(0, chosen[:, 0]) + chosen[:, 1]
            atomic = atomic.index_select(0, kept)
            systems_of_atoms = systems_of_atoms.index_select(0, kept)
            atoms = atoms.index_select(0, kept)
        if outputs["energy"].sample_kind == "atom":
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
        block = TensorBlock(
            values=values,
            samples=samples,
            components=[],
            properties=Labels(["energy"], torch.zeros((1, 1), dtype=torch.int32, device=device)),
        )
        keys = Labels(["_"], torch.zeros((1, 1), dtype=torch.int32, device=device))
        return {"energy": TensorMap(keys, [block])}
