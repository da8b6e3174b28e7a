"""What every architecture's model is to the trainer, the exporter and the calculators:
per-atom energies from the vectors of neighbor pairs, to which this base adds the
per-element energy baseline and the target scale, sums per structure, and derives
forces (-dE/dpositions) and stress ((1/V) dE/dstrain) by autograd, so every model is
conservative. TorchScript-compatible: the exported file holds the whole model.

An architecture implements ``atomic_outputs`` (unscaled per-atom energies in its own
precision) and ``set_precision``; it never sees the trainer or torch.distributed.
"""

from __future__ import annotations

from typing import Any

import torch

from ..targets import TargetSpec, is_direct
from .heads import NeighborBasis, TargetHead
from .pair_heads import PairHead


def mirrored_half(
    pair_first: torch.Tensor, pair_second: torch.Tensor, cell_shifts: torch.Tensor
) -> int:
    """How many pairs the first half holds when the second half is the first reversed,
    pair by pair ((j, i, -shift) for (i, j, shift)); 0 for any other layout."""
    n_pairs = pair_first.shape[0]
    half = n_pairs // 2
    if n_pairs == 0 or n_pairs % 2 == 1:
        return 0
    if (
        torch.equal(pair_first[half:], pair_second[:half])
        and torch.equal(pair_second[half:], pair_first[:half])
        and torch.equal(cell_shifts[half:], -cell_shifts[:half])
    ):
        return half
    return 0


# the buffers of a model's LLPR (none in its state_dict until computed)
LLPR_BUFFERS = (
    "llpr_covariance",
    "llpr_cholesky",
    "llpr_multiplier",
    "llpr_widths",
    "llpr_ensemble",
)


def uncertainty_name(output_name: str) -> str:
    """The exported name of an output's uncertainty: metatomic's energy_uncertainty for
    energy, energy_uncertainty/<variant> for energy/<variant>, and metatrain's
    mtt::aux::<name>_uncertainty for mtt::<name> or any other target."""
    if output_name == "energy" or output_name.startswith("energy/"):
        return "energy_uncertainty" + output_name.removeprefix("energy")
    return "mtt::aux::" + output_name.removeprefix("mtt::") + "_uncertainty"


def inverse_volumes(cell: torch.Tensor, periodic: torch.Tensor) -> torch.Tensor:
    """1 / volume of each cell [structures, 3, 3], and 0 for a structure that is not
    periodic (metatrain's infinite volume): what a per-volume target's sum is
    multiplied by."""
    volume = torch.abs(torch.linalg.det(cell))
    inverse = 1.0 / torch.where(periodic, volume, torch.ones_like(volume))
    return inverse * periodic.to(inverse.dtype)


def over_volumes(
    values: torch.Tensor,
    cell: torch.Tensor,
    periodic: torch.Tensor,
    system_index: torch.Tensor,
    per_atom: bool,
) -> torch.Tensor:
    """A per-volume target's values [structures, ...] (or [atoms, ...], or any samples
    when ``per_atom``: each row over its ``system_index`` entry's cell) over their cells'
    volumes."""
    inverse = inverse_volumes(cell, periodic).to(values.dtype)
    if per_atom:
        inverse = inverse.index_select(0, system_index)
    return values * inverse.reshape([-1] + [1] * (values.dim() - 1))


def ensemble_name(energy_name: str) -> str:
    """metatomic's name of an energy's ensemble: energy_ensemble for energy,
    energy_ensemble/<variant> for energy/<variant>."""
    return "energy_ensemble" + energy_name.removeprefix("energy")


class EnergyModel(torch.nn.Module):
    """E = scale * sum_i f(environment of i) + sum_i baseline_{Z_i}."""

    # hypers: the hyperparameter record ({"architecture", "atomic_types", "model"}) the
    # model is built from again; baseline_span: the composition directions the training
    # data determined the baseline along (rows), None when unknown; trained_on: what the
    # model was trained on, for the exported model's description. None is TorchScript's.
    __jit_ignored_attributes__ = ["hypers", "baseline_span", "trained_on", "reading_note"]

    def __init__(self, hypers: dict[str, Any], cutoff: float):
        super().__init__()
        atomic_types = sorted(int(z) for z in hypers["atomic_types"])
        self.hypers = {**hypers, "atomic_types": atomic_types}
        self.atomic_types = atomic_types
        self.baseline_span: list[list[float]] | None = None
        self.trained_on = ""
        # what reading another program's file left out, for the log ("" if nothing)
        self.reading_note = ""
        self.cutoff = float(cutoff)
        self.length_unit = "angstrom"
        self.energy_unit = "eV"
        type_to_index = torch.full((max(atomic_types) + 1,), -1, dtype=torch.long)
        type_to_index[torch.tensor(atomic_types)] = torch.arange(len(atomic_types))
        self.register_buffer("type_to_index", type_to_index)
        self.register_buffer("baseline", torch.zeros(len(atomic_types), dtype=torch.float64))
        self.register_buffer("scale", torch.ones((), dtype=torch.float64))
        # targets other than the energy (attach_targets): one head each, on the
        # architecture's per-atom features and the neighbors' geometry
        self.learns_energy = True
        self.target_names: list[str] = []
        self.per_atom_targets: list[bool] = []
        # a structure's value over its cell's volume (a non-conservative stress)
        self.per_volume_targets: list[bool] = []
        self.heads = torch.nn.ModuleList()
        self.basis = NeighborBasis(len(atomic_types), float(cutoff), False)
        # the energies it learns: the first through the architecture's own energy (and
        # the baseline and scale above), each other one (an energy variant,
        # "energy/<variant>") through a head of its own on the same features
        self.energy_names: list[str] = ["energy"]
        self.variant_heads = torch.nn.ModuleList()
        # a variant that learns its difference to the first energy (fine-tuning's
        # inherit_heads from it), per variant
        self.variant_relative: list[bool] = []
        # LLPR (training/llpr.py), for each of llpr_outputs (every energy, and each mtt::
        # target) in turn: the last-layer
        # features' covariance over the training set and the Cholesky factor of it
        # regularised (each [width, width], flattened one after the other), and the
        # calibrated multipliers of the uncertainties (one per subtarget); the widths
        # give the blocks (0: no uncertainty for that output). Empty until computed
        # after training.
        self.llpr_outputs: list[str] = ["energy"]
        self.llpr_subtargets: list[int] = [1]
        self.register_buffer("llpr_covariance", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("llpr_cholesky", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("llpr_multiplier", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("llpr_widths", torch.zeros(0, dtype=torch.long))
        # each energy's ensemble of last-layer weight displacements sampled from its
        # LLPR covariance, [width, members] flattened one energy after the other (the
        # energies with an uncertainty, in energy_names' order); empty: none
        self.register_buffer("llpr_ensemble", torch.zeros(0, dtype=torch.float64))

    @torch.jit.unused
    def attach_targets(
        self,
        specs: list[TargetSpec],
        energy_names: list[str] | tuple[str, ...] = ("energy",),
        relative: list[bool] | None = None,
    ) -> None:
        """Heads for ``specs`` (mtt:: targets) and for every energy after the first of
        ``energy_names`` (its variants; ``relative``: which learn their difference to the
        first) on this model's features, recorded in its hypers so that a checkpoint or
        an exported model builds them again."""
        energy_names = list(energy_names)
        self.variant_relative = list(relative or [False] * (len(energy_names) - 1))
        self.learns_energy = len(energy_names) > 0
        self.energy_names = energy_names
        self.target_names = [spec.name for spec in specs]
        self.per_atom_targets = [spec.per_atom for spec in specs]
        self.per_volume_targets = [spec.per_volume for spec in specs]
        # the neighbor basis's matrices, for the heads of mtt:: targets that need them
        matrices = any(
            irrep.o3_lambda == 2
            for spec in specs
            if not is_direct(spec.name)
            for irrep in spec.blocks()
        )
        self.basis = NeighborBasis(len(self.atomic_types), self.cutoff, matrices)
        width = self.feature_width()
        dtype = next(self.parameters()).dtype
        n_types, channels = len(self.atomic_types), self.basis.channels
        self.heads = torch.nn.ModuleList(
            [
                PairHead(spec, n_types, width, self.cutoff)
                if is_direct(spec.name)
                else TargetHead(spec, n_types, width, channels)
                for spec in specs
            ]
        )
        self.variant_heads = torch.nn.ModuleList(
            [
                TargetHead(TargetSpec(name, name, "scalar"), n_types, width, channels)
                for name in energy_names[1:]
            ]
        )
        self.heads_to(dtype)
        self.llpr_outputs = energy_names + [spec.name for spec in specs]
        self.llpr_subtargets = [1] * len(energy_names) + [spec.num_subtargets for spec in specs]
        self.hypers = {
            **self.hypers,
            "targets": {
                "energies": energy_names,
                "relative": self.variant_relative,
                "others": [spec.record() for spec in specs],
            },
        }

    @torch.jit.unused
    def energy_baseline(self, variant: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-element baseline [n_elements] and scale of energy ``variant`` (its
        position in energy_names), as views to copy into."""
        if variant == 0:
            return self.baseline, self.scale
        head = self.variant_heads[variant - 1]
        return head.baseline[:, 0], head.scale

    @torch.jit.unused
    def target_specs(self) -> list[TargetSpec]:
        """The mtt:: targets this model has heads for."""
        records = self.hypers.get("targets", {}).get("others", [])
        return [TargetSpec.from_record(record) for record in records]

    @torch.jit.unused
    def heads_to(self, dtype: torch.dtype) -> None:
        """The heads' networks and the neighbors' basis in ``dtype``; their baselines
        and scales stay float64."""
        self.basis.to(dtype)
        for head in [*self.heads, *self.variant_heads]:
            head.networks_to(dtype)

    @torch.jit.unused
    def feature_width(self) -> int:
        """How many invariant features atomic_features gives each atom."""
        raise NotImplementedError

    def atomic_features(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        """The architecture's invariant features of each atom, [n_atoms, feature_width],
        on which every head sits (architectures that learn mtt:: targets)."""
        raise NotImplementedError

    def energy_from_features(
        self, features: torch.Tensor, element_index: torch.Tensor
    ) -> torch.Tensor:
        """The architecture's unscaled energy of each atom from its features."""
        raise NotImplementedError

    def features_and_energies(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
        with_energies: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each atom's features and, when asked, its unscaled energy, from one pass (an
        architecture whose energy is not a function of its features alone overrides
        this)."""
        features = self.atomic_features(
            edge_vectors, pair_first, pair_second, element_index, mirrored
        )
        if not with_energies:
            return features, None
        return features, self.energy_from_features(features, element_index)

    def atomic_last_layer_features(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The architecture's unscaled energy of each atom [n_atoms] and the inputs of the
        linear maps its energy ends in [n_atoms, width] (the energy is linear in the
        weights of those maps: the "last layer" of LLPR), from one pass. Constant inputs
        (a bias's one) are left out: an atom's one is not seen apart from the others'
        in structures of one composition, and would give every atom a large
        uncertainty there."""
        raise NotImplementedError

    def set_precision(self, dtype: torch.dtype) -> EnergyModel:
        """The architecture's parameters in ``dtype``; the energy baseline and the sum of
        atomic energies stay in float64, since total energies can be large (-20000 eV)."""
        raise NotImplementedError

    @torch.jit.unused
    def parameter_layout(self) -> str:
        """How the parameters an optimizer holds are laid out: an architecture may train
        them in another layout than its state_dict gives (MACE on cuequivariance)."""
        return "default"

    @torch.jit.unused
    def use_kernels_for(self, device: torch.device) -> None:
        """Before training on ``device``: the kernels the architecture prefers there."""

    @torch.jit.unused
    def details(self) -> list[str]:
        """What the log says of the model besides its parameters, e.g. '1344 features'."""
        return []

    def set_baseline(self, baseline: torch.Tensor, scale: float) -> None:
        """Per-element energies (eV, ordered like ``atomic_types``) and target scale."""
        self.baseline.copy_(baseline)
        self.scale.fill_(scale)

    def energies(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        atomic_numbers: torch.Tensor,
        system_index: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        cell_shifts: torch.Tensor,
        mirrored_pairs: int = -1,
    ) -> torch.Tensor:
        """Total energy of each structure, [n_structures]."""
        edge_vectors, half = self.edge_geometry(
            positions, cell, system_index, pair_first, pair_second, cell_shifts, mirrored_pairs
        )
        atomic = self.atomic_energies(
            edge_vectors, pair_first, pair_second, atomic_numbers, half > 0
        )
        energy = torch.zeros(cell.shape[0], dtype=torch.float64, device=positions.device)
        return energy.index_add(0, system_index, atomic)

    def edge_geometry(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        system_index: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        cell_shifts: torch.Tensor,
        mirrored_pairs: int = -1,
    ) -> tuple[torch.Tensor, int]:
        """(the pairs' vectors, how many pairs the first half holds when the second is
        the first reversed, else 0). Pairs laid out [pairs; the same reversed] (as
        collated) need the geometry of the first half only: the reversed vectors are
        exactly the negated ones. ``mirrored_pairs``: that count when the caller knows it
        (a traced step, whose graph cannot look at the pairs), -1 to find it."""
        half = mirrored_pairs
        if half < 0:
            half = mirrored_half(pair_first, pair_second, cell_shifts)
        computed = half if half > 0 else pair_first.shape[0]
        first = pair_first[:computed]
        pair_cell = cell.index_select(0, system_index.index_select(0, first))
        edge_vectors = (
            positions.index_select(0, pair_second[:computed])
            - positions.index_select(0, first)
            + torch.bmm(cell_shifts[:computed].unsqueeze(1), pair_cell).squeeze(1)
        )
        return edge_vectors, half

    def atomic_predictions(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        atomic_numbers: torch.Tensor,
        mirrored: bool,
        only: list[str] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Every target of each atom from one pass of the features, by name: each energy
        [n_atoms] in float64 and each mtt:: target [n_atoms, width]; of the targets other
        than the energies, those of ``only`` when given (an engine asking the energy
        alone of a model with other heads does not pay for them)."""
        element_index = self.type_to_index.index_select(0, atomic_numbers)
        features, energies = self.features_and_energies(
            edge_vectors, pair_first, pair_second, element_index, mirrored, self.learns_energy
        )
        results: dict[str, torch.Tensor] = {}
        if energies is not None:
            atomic = energies.to(torch.float64)
            main = atomic * self.scale + self.baseline.index_select(0, element_index)
            results[self.energy_names[0]] = main
        for index, head in enumerate(self.variant_heads):
            variant = head.energies(features, element_index)
            if self.variant_relative[index] and energies is not None:
                variant = variant + results[self.energy_names[0]]
            results[self.energy_names[index + 1]] = variant
        asked = self.target_names if only is None else only
        any_asked = False
        for name in self.target_names:
            any_asked = any_asked or name in asked
        if not any_asked:
            return results  # energies only (variants): no geometry basis
        vectors, matrices = self.basis(
            edge_vectors.to(features.dtype), pair_first, pair_second, element_index, mirrored
        )
        for index, head in enumerate(self.heads):
            if self.target_names[index] in asked:
                results[self.target_names[index]] = head(
                    features,
                    element_index,
                    vectors,
                    matrices,
                    edge_vectors,
                    pair_first,
                    pair_second,
                    mirrored,
                )
        return results

    @torch.jit.export
    def energies_and_last_layer_features(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        atomic_numbers: torch.Tensor,
        mirrored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each atom's energy in float64 [n_atoms], as atomic_energies gives it, and its
        last-layer features in float64 [n_atoms, width]."""
        element_index = self.type_to_index.index_select(0, atomic_numbers)
        raw, features = self.atomic_last_layer_features(
            edge_vectors, pair_first, pair_second, element_index, mirrored
        )
        energies = raw.to(torch.float64) * self.scale
        energies = energies + self.baseline.index_select(0, element_index)
        return energies, features.to(torch.float64)

    @torch.jit.export
    def last_layer_features(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        atomic_numbers: torch.Tensor,
        mirrored: bool,
    ) -> dict[str, torch.Tensor]:
        """Each of llpr_outputs' last-layer features, by name, [n_atoms, values, width]
        in float64 (an energy: one value; an mtt:: target: its components x subtargets,
        as its predictions lay them out): the first energy's as
        atomic_last_layer_features gives them; a variant's, its head's hidden layer (and,
        for a variant that learns its difference to the first energy, the first energy's
        scaled, since it is linear in both); an mtt:: target's, its head's."""
        element_index = self.type_to_index.index_select(0, atomic_numbers)
        results: dict[str, torch.Tensor] = {}
        main = torch.zeros((0, 0), dtype=torch.float64, device=edge_vectors.device)
        if self.learns_energy:
            _, main = self.atomic_last_layer_features(
                edge_vectors, pair_first, pair_second, element_index, mirrored
            )
            main = main.to(torch.float64)
            results[self.energy_names[0]] = main.unsqueeze(1)
        if len(self.llpr_outputs) == len(results):
            return results
        features, _ = self.features_and_energies(
            edge_vectors, pair_first, pair_second, element_index, mirrored, False
        )
        for index, head in enumerate(self.variant_heads):
            hidden = head.hidden(features, element_index).to(torch.float64) * head.scale
            if self.variant_relative[index] and self.learns_energy:
                hidden = torch.cat([main * self.scale, hidden], dim=1)
            results[self.energy_names[index + 1]] = hidden.unsqueeze(1)
        if len(self.llpr_outputs) == len(results):
            return results
        vectors, matrices = self.basis(
            edge_vectors.to(features.dtype), pair_first, pair_second, element_index, mirrored
        )
        for index, head in enumerate(self.heads):
            results[self.target_names[index]] = head.last_layer_features(
                features,
                element_index,
                vectors,
                matrices,
                edge_vectors,
                pair_first,
                pair_second,
                mirrored,
            )
        return results

    @torch.jit.export
    def has_uncertainty(self) -> bool:
        """Whether LLPR was computed for this model (its uncertainties can be asked)."""
        return bool((self.llpr_widths > 0).any())

    @torch.jit.export
    def uncertainty_outputs(self) -> list[str]:
        """The outputs of llpr_outputs that have an uncertainty."""
        names: list[str] = []
        for index, name in enumerate(self.llpr_outputs):
            if index < self.llpr_widths.shape[0] and int(self.llpr_widths[index]) > 0:
                names.append(name)
        return names

    @torch.jit.export
    def uncertainties_of(self, name: str, features: torch.Tensor) -> torch.Tensor:
        """The calibrated LLPR uncertainty of each value of output ``name`` from its
        last-layer features ``features`` [n, values, width] (an atom's, or a structure's
        sum; values: components x subtargets, 1 for an energy): multiplier *
        sqrt(f^T (C + r I)^-1 f), [n, components, subtargets]."""
        index = self.llpr_outputs.index(name)
        start, first_multiplier = 0, 0
        for before in range(index):
            before_width = int(self.llpr_widths[before])
            start += before_width * before_width
            first_multiplier += self.llpr_subtargets[before]
        width = int(self.llpr_widths[index])
        cholesky = self.llpr_cholesky[start : start + width * width].reshape(width, width)
        multipliers = self.llpr_multiplier[
            first_multiplier : first_multiplier + self.llpr_subtargets[index]
        ]
        rows = features.to(torch.float64).reshape(-1, width)
        solved = torch.linalg.solve_triangular(cholesky, rows.transpose(0, 1), upper=False)
        sigma = torch.sqrt((solved * solved).sum(0))
        subtargets = self.llpr_subtargets[index]
        sigma = sigma.reshape(features.shape[0], features.shape[1] // subtargets, subtargets)
        return sigma * multipliers.reshape(1, 1, -1)

    @torch.jit.export
    def ensemble_outputs(self) -> list[str]:
        """The energies with an ensemble (every energy with an uncertainty, or none)."""
        names: list[str] = []
        if self.llpr_ensemble.shape[0] == 0:
            return names
        for name in self.uncertainty_outputs():
            if name in self.energy_names:
                names.append(name)
        return names

    @torch.jit.export
    def ensemble_deviations(self, name: str, features: torch.Tensor) -> torch.Tensor:
        """How each ensemble member's energy ``name`` differs from the model's, for each
        row of its last-layer features ``features`` [n, 1, width] (an atom's, or a
        structure's sum): [n, members], centred on zero."""
        energies = self.ensemble_outputs()
        total = 0
        for energy in energies:
            total += int(self.llpr_widths[self.llpr_outputs.index(energy)])
        members = self.llpr_ensemble.shape[0] // total
        start = 0
        for energy in energies[: energies.index(name)]:
            start += int(self.llpr_widths[self.llpr_outputs.index(energy)]) * members
        width = int(self.llpr_widths[self.llpr_outputs.index(name)])
        weights = self.llpr_ensemble[start : start + width * members].reshape(width, members)
        return features.to(torch.float64).reshape(-1, width) @ weights

    @torch.jit.export
    def uncertainties(self, features: torch.Tensor) -> torch.Tensor:
        """The first energy's calibrated LLPR uncertainty (eV) of each prediction whose
        last-layer features are a row of ``features`` [n, width] (an atom's, or a
        structure's sum), [n]."""
        return self.uncertainties_of(self.energy_names[0], features.unsqueeze(1)).reshape(-1)

    @torch.jit.unused
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if not self.has_uncertainty():  # a state without LLPR is as before LLPR existed
            for name in LLPR_BUFFERS:
                destination.pop(prefix + name, None)

    @torch.jit.unused
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
    ):
        # the LLPR buffers take the stored shapes; a state without them (a model without
        # LLPR) leaves the model without uncertainties, whatever it had
        stored = {name: state_dict.get(prefix + name) for name in LLPR_BUFFERS}
        covariance = stored["llpr_covariance"]
        if covariance is not None and covariance.dim() == 2:
            # the first format (one energy): its matrices whole and a scalar multiplier
            width = covariance.shape[0]
            stored = {
                "llpr_covariance": covariance.reshape(-1),
                "llpr_cholesky": stored["llpr_cholesky"].reshape(-1),
                "llpr_multiplier": stored["llpr_multiplier"].reshape(1),
                "llpr_widths": torch.tensor([width], dtype=torch.long),
            }
        for name in LLPR_BUFFERS:
            current = getattr(self, name)
            value = stored.get(name)
            value = value if value is not None else torch.zeros_like(current[:0])
            setattr(self, name, torch.zeros_like(value, device=current.device))
            state_dict[prefix + name] = value
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
        )

    @torch.jit.unused
    def clear_uncertainty(self) -> None:
        """No LLPR: the model's uncertainties are gone (a state without them)."""
        self.set_uncertainty({})

    @torch.jit.unused
    def set_uncertainty(
        self,
        fitted: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        ensembles: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """The LLPR of this model: for each output of llpr_outputs that has one, its
        covariance, its Cholesky factor and its multipliers (none: no LLPR); and for
        each energy among them, an ensemble's displacements [width, members] (none: no
        ensemble)."""
        device = self.baseline.device
        covariances, factors, multipliers, widths = [], [], [], []
        for name, subtargets in zip(self.llpr_outputs, self.llpr_subtargets):
            covariance, factor, multiplier = fitted.get(
                name, (torch.zeros((0, 0)), torch.zeros((0, 0)), torch.zeros(subtargets))
            )
            covariances.append(covariance.reshape(-1))
            factors.append(factor.reshape(-1))
            multipliers.append(multiplier.reshape(subtargets))
            widths.append(covariance.shape[0])
        if not any(widths):
            covariances, factors, multipliers, widths = [], [], [], []
        joined = [
            torch.cat([part.to(device, torch.float64) for part in parts])
            if parts
            else torch.zeros(0, dtype=torch.float64, device=device)
            for parts in (covariances, factors, multipliers)
        ]
        self.llpr_covariance, self.llpr_cholesky, self.llpr_multiplier = joined
        self.llpr_widths = torch.tensor(widths, dtype=torch.long, device=device)
        ensembles = ensembles or {}
        parts = [ensembles[name].reshape(-1) for name in self.energy_names if name in ensembles]
        self.llpr_ensemble = (
            torch.cat(parts).to(device, torch.float64)
            if parts
            else torch.zeros(0, dtype=torch.float64, device=device)
        )

    def atomic_energies(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        atomic_numbers: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        """Energy of each atom in float64, [n_atoms], from the vectors of its neighbor
        pairs. ``mirrored``: the second half of the pairs is the first reversed, and
        ``edge_vectors`` holds the vectors of the first half only."""
        element_index = self.type_to_index.index_select(0, atomic_numbers)
        atomic = self.atomic_outputs(edge_vectors, pair_first, pair_second, element_index, mirrored)
        return atomic.to(torch.float64) * self.scale + self.baseline.index_select(0, element_index)

    def atomic_outputs(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        """The architecture's unscaled energy of each atom, [n_atoms], in its precision
        (``element_index``: each atom's position in atomic_types)."""
        raise NotImplementedError

    # exported: the metatomic wrapper calls atomic_energies, and atomtrain's own eval
    # and calculator call this batched entry point of the inner model
    @torch.jit.export
    def forward(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        atomic_numbers: torch.Tensor,
        system_index: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        cell_shifts: torch.Tensor,
        periodic: torch.Tensor,
        compute_forces: bool = True,
        compute_stress: bool = False,
        create_graph: bool = False,
        energy_variant: torch.Tensor | None = None,
        mirrored_pairs: int = -1,
    ) -> dict[str, torch.Tensor]:
        """Energy [n_structures], and on request forces [n_atoms, 3] and stress
        [n_structures, 3, 3] (zero for non-periodic structures); each mtt:: target by
        name. ``energy_variant``: which of energy_names each structure's energy is (the
        first when None). ``mirrored_pairs``: see edge_geometry."""
        inputs: list[torch.Tensor] = []
        if compute_forces:
            positions = positions.detach().requires_grad_(True)
            inputs.append(positions)
        strain = torch.zeros_like(cell)
        if compute_stress:
            strain.requires_grad_(True)
            inputs.append(strain)
            symmetric = 0.5 * (strain + strain.transpose(1, 2))
            deformed_positions = positions + torch.bmm(
                positions.unsqueeze(1), symmetric.index_select(0, system_index)
            ).squeeze(1)
            deformed_cell = cell + torch.bmm(cell, symmetric)
        else:
            deformed_positions = positions
            deformed_cell = cell
        results: dict[str, torch.Tensor] = {}
        if len(self.heads) == 0 and len(self.variant_heads) == 0 and self.learns_energy:
            energy = self.energies(
                deformed_positions,
                deformed_cell,
                atomic_numbers,
                system_index,
                pair_first,
                pair_second,
                cell_shifts,
                mirrored_pairs,
            )
        else:
            edge_vectors, half = self.edge_geometry(
                deformed_positions,
                deformed_cell,
                system_index,
                pair_first,
                pair_second,
                cell_shifts,
                mirrored_pairs,
            )
            atomic = self.atomic_predictions(
                edge_vectors, pair_first, pair_second, atomic_numbers, half > 0
            )
            n_structures = cell.shape[0]
            for index, spec_name in enumerate(self.target_names):
                values = atomic[spec_name]
                if not self.per_atom_targets[index]:  # a sum of atomic contributions
                    total = torch.zeros(
                        (n_structures, values.shape[1]), dtype=values.dtype, device=values.device
                    )
                    values = total.index_add(0, system_index, values)
                if self.per_volume_targets[index]:
                    values = over_volumes(
                        values, cell, periodic, system_index, self.per_atom_targets[index]
                    )
                results[spec_name] = values
            energy = torch.zeros(n_structures, dtype=torch.float64, device=positions.device)
            # the first energy's totals, or, when structures name their variants, each
            # energy's, from which every structure takes its own
            used = self.energy_names if energy_variant is not None else self.energy_names[:1]
            totals = [energy.index_add(0, system_index, atomic[name]) for name in used]
            if len(totals) == 1:
                energy = totals[0]
            elif len(totals) > 1 and energy_variant is not None:
                energy = torch.stack(totals).gather(0, energy_variant.unsqueeze(0)).squeeze(0)
        results["energy"] = energy
        if len(inputs) == 0 or not self.learns_energy:
            return results
        gradients = torch.autograd.grad(
            [energy.sum()], inputs, create_graph=create_graph, allow_unused=True
        )
        if compute_forces:
            gradient = gradients[0]
            results["forces"] = -gradient if gradient is not None else torch.zeros_like(positions)
        if compute_stress:
            gradient = gradients[-1]
            if gradient is None:
                gradient = torch.zeros_like(cell)
            volume = torch.abs(torch.linalg.det(cell))
            volume = torch.where(periodic, volume, torch.ones_like(volume))
            stress = gradient / volume.reshape(-1, 1, 1)
            results["stress"] = stress * periodic.reshape(-1, 1, 1).to(stress.dtype)
        return results


# TorchScript types attributes by the class's annotations, which must be types, not the
# strings postponed annotations leave: an empty list could not be typed otherwise
EnergyModel.__annotations__.update(
    llpr_outputs=list[str],
    llpr_subtargets=list[int],
    target_names=list[str],
    per_atom_targets=list[bool],
    per_volume_targets=list[bool],
    energy_names=list[str],
    variant_relative=list[bool],
)
