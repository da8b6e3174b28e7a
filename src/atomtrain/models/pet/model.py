"""PET as an atomtrain energy model: metatrain's ``PETBackend``, unchanged, fed the
neighbor pairs' vectors in its neighbor layout (NEF). The trainer's baseline and scale
go around it, as metatrain's composition model and scaler go around it in metatrain.

The backend's own preprocessing finds each pair's reverse from integer cell shifts;
atomtrain's pairs come as [pairs; the same reversed], so the reverse of pair k is known
(k + half, and back), and the inputs are built here from metatrain's NEF helpers with
that correspondence."""

from __future__ import annotations

import torch

from ..data_sizes import most_pairs, occurrences
from ..energy_model import EnergyModel
from . import ARCHITECTURE_NAME
from .library import import_pet
from .options import ModelOptions

backend, nef, cutoff_functions = import_pet()
PETBackend = backend.PETBackend

# metatrain names an output's blocks by their keys: the energy's one block, key "_" = 0
ENERGY_BLOCK = "energy___0"


class PetModel(EnergyModel):
    """Atomic energy: PET's prediction for the atom (its node and its edges' terms)."""

    def __init__(self, atomic_types: list[int], options: ModelOptions):
        hypers = {
            "architecture": ARCHITECTURE_NAME,
            "atomic_types": list(atomic_types),
            "model": options.model_dump(mode="json"),
        }
        super().__init__(hypers, options.cutoff)
        self.pet = PETBackend(options.backend_hypers(), self.atomic_types)
        self.pet.add_output("energy", {ENERGY_BLOCK: [1]})
        self.pet.to(torch.float64)
        self.cutoff_width = float(options.cutoff_width)
        self.bump = options.cutoff_function == "Bump"
        self.readout_width = options.d_node + options.d_pet

    def set_precision(self, dtype: torch.dtype) -> PetModel:
        self.pet.to(dtype)
        self.heads_to(dtype)
        return self

    @torch.jit.unused
    def details(self) -> list[str]:
        model = self.hypers["model"]
        return [
            f"{model['num_gnn_layers']} message-passing layers of "
            f"{model['num_attention_layers']} attention layers",
            f"d_pet {model['d_pet']}, d_node {model['d_node']}",
        ]

    @torch.jit.unused
    def feature_width(self) -> int:
        return self.pet.num_readout_layers * self.readout_width

    def atomic_outputs(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        inputs, nodes, edges = self.run_pet(
            edge_vectors, pair_first, pair_second, element_index, mirrored
        )
        return self.energies_of(inputs, nodes, edges, element_index)

    def features_and_energies(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
        with_energies: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each atom's node features and the cutoff-weighted sum of its edges' features
        (metatrain's "features" output), and its energy, from one pass of PET."""
        inputs, nodes, edges = self.run_pet(
            edge_vectors, pair_first, pair_second, element_index, mirrored
        )
        weights = inputs["cutoff_factors"].unsqueeze(-1)
        parts: list[torch.Tensor] = []
        for node, edge in zip(nodes, edges):
            parts.append(node)
            parts.append((edge * weights).sum(dim=1))
        features = torch.cat(parts, dim=1)
        if not with_energies:
            return features, None
        return features, self.energies_of(inputs, nodes, edges, element_index)

    def atomic_last_layer_features(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PET's energy of each atom and, as metatrain's LLPR takes them, the inputs of
        its energy's last layers: per readout layer, the node head's output and the
        cutoff-weighted sum of the edge head's outputs."""
        inputs, nodes, edges = self.run_pet(
            edge_vectors, pair_first, pair_second, element_index, mirrored
        )
        cells = torch.zeros((0, 3, 3), dtype=nodes[0].dtype, device=nodes[0].device)
        atomic, node_last, edge_last = self.pet.predict(
            nodes, edges, inputs, cells, element_index, ["energy"]
        )
        weights = inputs["cutoff_factors"].unsqueeze(-1)
        parts: list[torch.Tensor] = []
        for node, edge in zip(node_last["energy"], edge_last["energy"]):
            parts.append(node)
            parts.append((edge * weights).sum(dim=1))
        # the edge layers' biases enter as the sum of the weights (the node layers',
        # constants, are left out as every architecture's are: see EnergyModel)
        parts.append(weights.sum(dim=1))
        return atomic["energy"][0].reshape(-1), torch.cat(parts, dim=1)

    def run_pet(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """PET's inputs, and its node and edge features of each readout layer."""
        vectors = edge_vectors.to(self.pet.edge_embedder.weight.dtype)
        n_atoms = element_index.shape[0]
        if n_atoms == 0 or pair_first.shape[0] == 0:
            # no pair at all (a rank's empty share, isolated atoms): PET's NEF grid would
            # be empty; nodes alone, still tied to the positions for the derivatives
            vectors = vectors.new_zeros((0, 3)) + vectors.sum() * 0.0
            mirrored = True
        if not mirrored:
            raise RuntimeError(
                "PET needs each neighbor pair's reverse: pairs laid out as the pairs, then "
                "the same reversed (as atomtrain's batches and its metatomic model give them)"
            )
        inputs = self.network_inputs(vectors, pair_first, pair_second, element_index)
        nodes, edges = self.pet.calculate_features(inputs)
        return inputs, nodes, edges

    def energies_of(
        self,
        inputs: dict[str, torch.Tensor],
        nodes: list[torch.Tensor],
        edges: list[torch.Tensor],
        element_index: torch.Tensor,
    ) -> torch.Tensor:
        """PET's unscaled energy of each atom from its features [n_atoms]."""
        # the cells only normalise metatrain's non-conservative stress: none here
        cells = torch.zeros((0, 3, 3), dtype=nodes[0].dtype, device=nodes[0].device)
        atomic, _, _ = self.pet.predict(nodes, edges, inputs, cells, element_index, ["energy"])
        return atomic["energy"][0].reshape(-1)

    def network_inputs(
        self,
        half_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """What PETBackend.calculate_features takes, as metatrain's compute_batch_tensors
        makes it, from the first half's vectors (the second half is their negation)."""
        vectors = torch.cat([half_vectors, -half_vectors])
        half = half_vectors.shape[0]
        centers = pair_first[: 2 * half]
        neighbors = pair_second[: 2 * half]
        n_atoms = element_index.shape[0]
        distances = torch.norm(vectors, dim=-1) + 1e-15
        pair_cutoffs = torch.full_like(distances, self.cutoff)
        if self.bump:
            factors = cutoff_functions.cutoff_func_bump(distances, pair_cutoffs, self.cutoff_width)
        else:
            factors = cutoff_functions.cutoff_func_cosine(
                distances, pair_cutoffs, self.cutoff_width
            )
        counts = occurrences(centers, n_atoms)
        widest = most_pairs(counts, per_element=False)
        nef_indices, nef_to_edges, nef_mask = nef.get_nef_indices(centers, counts, widest)
        nef_vectors = nef.edge_array_to_nef(vectors, nef_indices)
        reverse = torch.arange(2 * half, device=centers.device).roll(half)
        reversed_list = nef.compute_reversed_neighbor_list(
            nef_indices, reverse, nef_to_edges, nef_mask
        )
        neighbor_index = nef.edge_array_to_nef(neighbors, nef_indices).to(torch.int64)
        reverse_index = (neighbor_index * neighbor_index.shape[1] + reversed_list).reshape(-1)
        # padded slots get distinct indices (metatrain's choice: repeated ones make the
        # backward of the gather slow)
        flat_mask = nef_mask.reshape(-1)
        padded = torch.cumsum((~flat_mask).to(torch.long), dim=0) - 1
        reverse_index = torch.where(flat_mask, reverse_index, padded)
        return {
            "element_indices_nodes": element_index,
            "element_indices_neighbors": nef.edge_array_to_nef(
                element_index.index_select(0, neighbors), nef_indices
            ),
            "edge_vectors": nef_vectors,
            "edge_distances": torch.sqrt(torch.sum(nef_vectors**2, dim=2) + 1e-15),
            "padding_mask": nef_mask,
            "reverse_neighbor_index": reverse_index.reshape(nef_mask.shape),
            "cutoff_factors": nef.edge_array_to_nef(factors, nef_indices, nef_mask, 0.0),
        }
