"""The exported model as metatomic defines it: systems and a neighbor list in, an energy
TensorMap out. Engines (ASE, i-PI, LAMMPS, TorchSim) compute the neighbor list, and the
forces, stress and virials by autograd through it."""

# metatomic checks the annotations of forward by their spelling (List[System], not
# list[System]), so this module keeps typing's names and no postponed annotations
# ruff: noqa: UP006, UP035, UP045
from typing import Dict, List, Optional, Tuple

import torch
from metatensor.torch import Labels, TensorBlock, TensorMap
from metatomic.torch import ModelOutput, NeighborListOptions, System

from ..targets import TargetSpec
from .energy_model import EnergyModel, ensemble_name, over_volumes, uncertainty_name


class MetatomicEnergy(torch.nn.Module):
    """The ``energy`` output of an EnergyModel, per system or per atom, for the atoms of
    ``selected_atoms`` (all when None)."""

    target_names: List[str]
    target_kinds: List[str]
    target_ranks: List[int]
    target_subtargets: List[int]
    target_irreps: List[List[int]]
    energy_names: List[str]
    uncertain_outputs: List[str]
    uncertainty_names: List[str]
    ensemble_energies: List[str]
    ensemble_names: List[str]

    def __init__(
        self,
        model: EnergyModel,
        specs: Optional[List[TargetSpec]] = None,
        energy_names: Optional[List[str]] = None,
    ):
        super().__init__()
        self.model = model
        self.energy_names = energy_names if energy_names is not None else ["energy"]
        # one energy and nothing else: the energy alone, as MD engines ask at every step
        self.energy_only = self.energy_names == ["energy"] and not specs
        # the outputs with an LLPR uncertainty, and the names it is asked by
        self.uncertain_outputs: List[str] = model.uncertainty_outputs()
        self.uncertainty_names: List[str] = [
            uncertainty_name(name) for name in self.uncertain_outputs
        ]
        # the energies with an LLPR ensemble, and the names it is asked by
        self.ensemble_energies: List[str] = model.ensemble_outputs()
        self.ensemble_names: List[str] = [ensemble_name(name) for name in self.ensemble_energies]
        # the mtt:: targets' layouts (what target_map builds), in TorchScript's types
        specs = specs if specs is not None else []
        self.target_names: List[str] = [spec.name for spec in specs]
        self.target_kinds: List[str] = [spec.kind for spec in specs]
        self.target_ranks: List[int] = [spec.rank for spec in specs]
        self.target_subtargets: List[int] = [spec.num_subtargets for spec in specs]
        self.target_irreps: List[List[int]] = [
            [number for irrep in spec.irreps for number in (irrep.o3_lambda, irrep.o3_sigma)]
            for spec in specs
        ]
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
        wanted: List[str] = []
        for name in outputs.keys():
            if name in self.energy_names or name in self.target_names:
                wanted.append(name)
        uncertain: List[int] = []
        for index, name in enumerate(self.uncertainty_names):
            if name in outputs:
                uncertain.append(index)
        ensembles: List[int] = []
        for index, name in enumerate(self.ensemble_names):
            if name in outputs:
                ensembles.append(index)
        if len(wanted) == 0 and len(uncertain) == 0 and len(ensembles) == 0:
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
        # the model's inputs: the half list mirrored, its geometry computed once
        pair_vectors = joined(vectors)
        pair_first = torch.cat([first, second])
        pair_second = torch.cat([second, first])
        atom_types = joined(types)
        results: Dict[str, TensorMap] = {}
        if len(ensembles) > 0:
            self.add_ensembles(
                results,
                ensembles,
                outputs,
                pair_vectors,
                pair_first,
                pair_second,
                atom_types,
                systems,
                starts,
                offset,
                selected_atoms,
            )
            if len(wanted) == 0 and len(uncertain) == 0:
                return results
        if len(uncertain) > 0 and self.energy_only:
            name = self.uncertainty_names[0]
            energies, features = self.model.energies_and_last_layer_features(
                pair_vectors,
                pair_first,
                pair_second,
                atom_types,
                True,
            )
            per_atom = outputs[name].sample_kind == "atom"
            values, samples = self.samples_of(
                features, systems, starts, offset, per_atom, selected_atoms
            )
            sigma = self.model.uncertainties(values).unsqueeze(1)
            results[name] = energy_map(sigma, samples)["energy"]
            if len(wanted) == 1:
                # the energy from the same pass (ASE asks both at every step)
                per_atom = outputs["energy"].sample_kind == "atom"
                values, samples = self.samples_of(
                    energies.reshape(-1, 1), systems, starts, offset, per_atom, selected_atoms
                )
                results["energy"] = energy_map(values, samples)["energy"]
                return results
            if len(wanted) == 0:
                return results
        elif len(uncertain) > 0:
            self.add_uncertainties(
                results,
                uncertain,
                outputs,
                pair_vectors,
                pair_first,
                pair_second,
                atom_types,
                systems,
                starts,
                offset,
                selected_atoms,
            )
            if len(wanted) == 0:
                return results
        if self.energy_only:
            atomic = self.model.atomic_energies(
                pair_vectors,
                pair_first,
                pair_second,
                atom_types,
                True,
            )
            per_atom = outputs["energy"].sample_kind == "atom"
            if len(systems) == 1 and selected_atoms is None and not per_atom:
                # what an MD engine asks at every step: a dozen operations fewer
                total = Labels(["system"], torch.zeros((1, 1), dtype=torch.int32, device=device))
                results["energy"] = energy_map(atomic.sum().reshape(1, 1), total)["energy"]
                return results
            values, samples = self.samples_of(
                atomic.reshape(-1, 1), systems, starts, offset, per_atom, selected_atoms
            )
            results["energy"] = energy_map(values, samples)["energy"]
            return results
        predictions = self.model.atomic_predictions(
            pair_vectors,
            pair_first,
            pair_second,
            atom_types,
            True,
            wanted,
        )
        for name in wanted:
            atomic = predictions[name]
            per_atom = outputs[name].sample_kind == "atom"
            values, samples = self.samples_of(
                atomic.unsqueeze(1) if atomic.dim() == 1 else atomic,
                systems,
                starts,
                offset,
                per_atom,
                selected_atoms,
            )
            if name in self.energy_names:
                results[name] = energy_map(values, samples)["energy"]
                continue
            index = self.target_names.index(name)
            if self.model.per_volume_targets[index]:
                values = self.over_volumes(values, systems, samples)
            results[name] = self.target_map(index, values, samples)
        return results

    def over_volumes(
        self, values: torch.Tensor, systems: List[System], samples: Labels
    ) -> torch.Tensor:
        """A per-volume target's values over the cell volume of each sample's system, as
        the model's forward divides them (each sample indexed by its system)."""
        cells = torch.stack([system.cell for system in systems])
        periodic = torch.stack([torch.any(system.pbc) for system in systems])
        systems_of = samples.column("system").to(torch.long)
        return over_volumes(values, cells, periodic, systems_of, True)

    def add_uncertainties(
        self,
        results: Dict[str, TensorMap],
        uncertain: List[int],
        outputs: Dict[str, ModelOutput],
        vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        types: torch.Tensor,
        systems: List[System],
        starts: List[int],
        offset: int,
        selected_atoms: Optional[Labels],
    ):
        """Each asked LLPR uncertainty (of an energy or an mtt:: target, laid out as
        the output), per system or per atom, from one pass of the last-layer features."""
        every = self.model.last_layer_features(vectors, pair_first, pair_second, types, True)
        for index in uncertain:
            output = self.uncertain_outputs[index]
            name = self.uncertainty_names[index]
            atomic = every[output]  # [atoms, values, width]
            per_atom = outputs[name].sample_kind == "atom"
            values, samples = self.samples_of(
                atomic.reshape(atomic.shape[0], -1),
                systems,
                starts,
                offset,
                per_atom,
                selected_atoms,
            )
            position = -1
            if output not in self.energy_names:
                position = self.target_names.index(output)
                if self.model.per_volume_targets[position]:
                    values = self.over_volumes(values, systems, samples)
            sigma = self.model.uncertainties_of(
                output, values.reshape(values.shape[0], atomic.shape[1], atomic.shape[2])
            )
            sigma = sigma.reshape(sigma.shape[0], -1)
            if position < 0:
                results[name] = energy_map(sigma, samples)["energy"]
            else:
                results[name] = self.target_map(position, sigma, samples)

    def add_ensembles(
        self,
        results: Dict[str, TensorMap],
        ensembles: List[int],
        outputs: Dict[str, ModelOutput],
        vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        types: torch.Tensor,
        systems: List[System],
        starts: List[int],
        offset: int,
        selected_atoms: Optional[Labels],
    ):
        """Each asked energy ensemble: every member's energy, the model's plus its
        last-layer weights' displacement times the features, per system or per atom,
        with a graph through the positions (engines take each member's forces)."""
        if self.energy_only:  # the energy and its features from one pass of the model
            energies, main = self.model.energies_and_last_layer_features(
                vectors, pair_first, pair_second, types, True
            )
            predictions = {"energy": energies}
            features = {"energy": main}
        else:
            predictions = self.model.atomic_predictions(
                vectors, pair_first, pair_second, types, True
            )
            features = self.model.last_layer_features(vectors, pair_first, pair_second, types, True)
        for index in ensembles:
            energy = self.ensemble_energies[index]
            name = self.ensemble_names[index]
            deviations = self.model.ensemble_deviations(energy, features[energy])
            atomic = predictions[energy].unsqueeze(1) + deviations  # [atoms, members]
            per_atom = outputs[name].sample_kind == "atom"
            values, samples = self.samples_of(
                atomic, systems, starts, offset, per_atom, selected_atoms
            )
            members = torch.arange(values.shape[1], dtype=torch.int32, device=values.device)
            block = TensorBlock(
                values=values,
                samples=samples,
                components=[],
                properties=Labels(["energy"], members.reshape(-1, 1)),
            )
            keys = Labels(["_"], torch.zeros((1, 1), dtype=torch.int32, device=values.device))
            results[name] = TensorMap(keys, [block])

    def samples_of(
        self,
        atomic: torch.Tensor,
        systems: List[System],
        starts: List[int],
        offset: int,
        per_atom: bool,
        selected_atoms: Optional[Labels],
    ) -> Tuple[torch.Tensor, Labels]:
        """Per-atom values [atoms, width] as the samples asked for: the atoms of
        ``selected_atoms`` (all when None), each or summed per system."""
        device = atomic.device
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
            samples = Labels(
                ["system", "atom"], torch.stack([systems_of_atoms, atoms], dim=1).to(torch.int32)
            )
            return atomic, samples
        total = torch.zeros((len(systems), atomic.shape[1]), dtype=atomic.dtype, device=device)
        samples = Labels(
            ["system"],
            torch.arange(len(systems), dtype=torch.int32, device=device).reshape(-1, 1),
        )
        return total.index_add(0, systems_of_atoms, atomic), samples

    def target_map(self, index: int, values: torch.Tensor, samples: Labels) -> TensorMap:
        """An mtt:: target's values [samples, width] as metatrain lays it out: one block
        of components (xyz; xyz_1, xyz_2) and subtargets, or one block per irrep."""
        device = values.device
        subtargets = self.target_subtargets[index]
        kind = self.target_kinds[index]
        # a standard output (non_conservative_force) names its property after itself
        name = self.target_names[index]
        properties = Labels(
            ["properties" if name.startswith("mtt::") else name],
            torch.arange(subtargets, dtype=torch.int32, device=device).reshape(-1, 1),
        )
        if kind != "spherical":
            xyz = Labels(["xyz"], torch.arange(3, dtype=torch.int32, device=device).reshape(-1, 1))
            components: List[Labels] = []
            shape = [values.shape[0]]
            if kind == "cartesian" and self.target_ranks[index] == 1:
                components = [xyz]
                shape = shape + [3]
            elif kind == "cartesian":
                components = [
                    Labels(["xyz_1"], xyz.values),
                    Labels(["xyz_2"], xyz.values),
                ]
                shape = shape + [3, 3]
            block = TensorBlock(
                values=values.reshape(shape + [subtargets]),
                samples=samples,
                components=components,
                properties=properties,
            )
            keys = Labels(["_"], torch.zeros((1, 1), dtype=torch.int32, device=device))
            return TensorMap(keys, [block])
        irreps = self.target_irreps[index]
        shaped = values.reshape(values.shape[0], values.shape[1] // subtargets, subtargets)
        blocks: List[TensorBlock] = []
        start = 0
        for position in range(len(irreps) // 2):
            o3_lambda = irreps[2 * position]
            size = 2 * o3_lambda + 1
            mu = torch.arange(-o3_lambda, o3_lambda + 1, dtype=torch.int32, device=device)
            blocks.append(
                TensorBlock(
                    values=shaped[:, start : start + size, :],
                    samples=samples,
                    components=[Labels(["o3_mu"], mu.reshape(-1, 1))],
                    properties=properties,
                )
            )
            start += size
        keys = Labels(
            ["o3_lambda", "o3_sigma"],
            torch.tensor(irreps, dtype=torch.int32, device=device).reshape(-1, 2),
        )
        return TensorMap(keys, blocks)


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
