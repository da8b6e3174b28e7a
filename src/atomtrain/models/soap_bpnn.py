"""SOAP-BPNN: SOAP features, per-element networks, a per-element energy baseline.

Forces are -dE/dpositions and stress is (1/V) dE/dstrain, both by autograd, so the
model is conservative. The module is TorchScript-compatible: the exported file holds
the features, networks, baseline, scaling, cutoff and units.
"""

from __future__ import annotations

import torch

from .bpnn import ElementNetworks, LayerNorm
from .soap import SoapPowerSpectrum

ARCHITECTURE_NAME = "soap_bpnn"


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


class SoapBpnn(torch.nn.Module):
    """Energy model E = scale * sum_i NN_{Z_i}(SOAP_i) + sum_i baseline_{Z_i}."""

    # baseline_span: the composition directions the training data determined the
    # baseline along (rows), None when unknown; kept for fine-tuning, not for TorchScript.
    # trained_on: what the model was trained on, for the exported model's description
    __jit_ignored_attributes__ = ["hypers", "baseline_span", "trained_on"]

    def __init__(
        self,
        atomic_types: list[int],
        cutoff: float = 5.0,
        cutoff_width: float = 0.5,
        max_radial: int = 7,
        max_angular: int = 6,
        num_hidden_layers: int = 2,
        num_neurons_per_layer: int = 32,
        layernorm: bool = True,
        length_unit: str = "angstrom",
        energy_unit: str = "eV",
    ):
        super().__init__()
        atomic_types = sorted(int(z) for z in atomic_types)
        self.hypers = {
            "atomic_types": atomic_types,
            "cutoff": float(cutoff),
            "cutoff_width": float(cutoff_width),
            "max_radial": int(max_radial),
            "max_angular": int(max_angular),
            "num_hidden_layers": int(num_hidden_layers),
            "num_neurons_per_layer": int(num_neurons_per_layer),
            "layernorm": bool(layernorm),
            "length_unit": length_unit,
            "energy_unit": energy_unit,
        }
        self.atomic_types = atomic_types
        self.baseline_span: list[list[float]] | None = None
        self.trained_on = ""
        self.cutoff = float(cutoff)
        self.length_unit = length_unit
        self.energy_unit = energy_unit
        type_to_index = torch.full((max(atomic_types) + 1,), -1, dtype=torch.long)
        type_to_index[torch.tensor(atomic_types)] = torch.arange(len(atomic_types))
        self.register_buffer("type_to_index", type_to_index)
        self.soap = SoapPowerSpectrum(
            len(atomic_types), cutoff, cutoff_width, max_radial, max_angular
        )
        self.layernorm = LayerNorm(self.soap.n_features) if layernorm else torch.nn.Identity()
        self.networks = ElementNetworks(
            len(atomic_types),
            self.soap.n_features,
            num_hidden_layers,
            num_neurons_per_layer,
        )
        self.register_buffer("baseline", torch.zeros(len(atomic_types), dtype=torch.float64))
        self.register_buffer("scale", torch.ones((), dtype=torch.float64))

    def set_precision(self, dtype: torch.dtype) -> SoapBpnn:
        """Features and networks in ``dtype``; the energy baseline and the sum of atomic
        energies stay in float64, since total energies can be large (-20000 eV)."""
        self.soap.to(dtype)
        self.layernorm.to(dtype)
        self.networks.to(dtype)
        return self

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
    ) -> torch.Tensor:
        """Total energy of each structure, [n_structures]."""
        # Pairs laid out [pairs; the same reversed] (as collated) need the geometry of
        # the first half only: the reversed vectors are exactly the negated ones.
        half = mirrored_half(pair_first, pair_second, cell_shifts)
        computed = half if half > 0 else pair_first.shape[0]
        first = pair_first[:computed]
        pair_cell = cell.index_select(0, system_index.index_select(0, first))
        edge_vectors = (
            positions.index_select(0, pair_second[:computed])
            - positions.index_select(0, first)
            + torch.bmm(cell_shifts[:computed].unsqueeze(1), pair_cell).squeeze(1)
        )
        atomic = self.atomic_energies(
            edge_vectors, pair_first, pair_second, atomic_numbers, half > 0
        )
        energy = torch.zeros(cell.shape[0], dtype=torch.float64, device=positions.device)
        return energy.index_add(0, system_index, atomic)

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
        features = self.soap(
            edge_vectors.to(self.soap.wavenumbers.dtype),  # the features' dtype
            pair_first,
            element_index.index_select(0, pair_second),
            atomic_numbers.shape[0],
            mirrored,
        )
        atomic = self.networks(self.layernorm(features), element_index)
        return atomic.to(torch.float64) * self.scale + self.baseline.index_select(0, element_index)

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
    ) -> dict[str, torch.Tensor]:
        """Energy [n_structures], and on request forces [n_atoms, 3] and stress
        [n_structures, 3, 3] (zero for non-periodic structures)."""
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
        energy = self.energies(
            deformed_positions,
            deformed_cell,
            atomic_numbers,
            system_index,
            pair_first,
            pair_second,
            cell_shifts,
        )
        results: dict[str, torch.Tensor] = {"energy": energy}
        if len(inputs) == 0:
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
