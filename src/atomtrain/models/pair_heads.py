"""Heads for the direct (non-conservative) forces and stress: sums of terms of each
neighbor pair, as a force field's forces and virial are.

A pair (i, j) gets an invariant weight ``w_ij`` from both atoms' features and i's
element, filtered by radial functions of the distance (a network on the product, times
a smooth envelope that vanishes at the cutoff). The force on i is
``sum_j w_ij r_ij/|r_ij|``; i's contribution to the stress is
``sum_j w_ij r_ij r_ij^T/|r_ij|^2`` plus a per-element baseline times the identity,
summed over the structure and divided by its volume by the model. Invariant weights
times vectors and their outer products are exactly equivariant, and the stress is
symmetric. A head of a fixed basis on i's features alone (heads.TargetHead) learnt
ethanol's forces some eight times worse than the energy's gradient did (357 against 46
meV/A); with the neighbor's features in each pair's weight, 66: they are what direct
forces need (as PET's edge heads, or the direct-force heads of GemNet and PaiNN, use
them)."""

from __future__ import annotations

import math

import torch

from ..targets import TargetSpec
from .heads import smooth_radial

HIDDEN_WIDTH = 64
RADIAL_FUNCTIONS = 8


class PairHead(torch.nn.Module):
    """A direct force [atoms, 3] or stress contribution [atoms, 9] of each atom, in the
    file's layout (x, y, z; a matrix row-major); the scale and baseline are fitted from
    the training data as a TargetHead's."""

    def __init__(self, spec: TargetSpec, n_types: int, n_features: int, cutoff: float):
        super().__init__()
        self.matrix = spec.rank == 2
        self.cutoff = cutoff
        self.center = torch.nn.Linear(n_features, HIDDEN_WIDTH)
        self.neighbor = torch.nn.Linear(n_features, HIDDEN_WIDTH, bias=False)
        self.element = torch.nn.Embedding(n_types, HIDDEN_WIDTH)
        torch.nn.init.zeros_(self.element.weight)
        self.distance = torch.nn.Linear(RADIAL_FUNCTIONS, HIDDEN_WIDTH, bias=False)
        self.network = torch.nn.Sequential(
            torch.nn.SiLU(),
            torch.nn.Linear(HIDDEN_WIDTH, HIDDEN_WIDTH),
            torch.nn.SiLU(),
            torch.nn.Linear(HIDDEN_WIDTH, 1),
        )
        # starts at the baseline, as a TargetHead does
        torch.nn.init.zeros_(self.network[-1].weight)
        torch.nn.init.zeros_(self.network[-1].bias)
        self.register_buffer(
            "frequencies",
            torch.arange(1, RADIAL_FUNCTIONS + 1, dtype=torch.float64) * math.pi / cutoff,
        )
        self.register_buffer("baseline", torch.zeros((n_types, 1), dtype=torch.float64))
        self.register_buffer("scale", torch.ones((), dtype=torch.float64))

    def forward(
        self,
        features: torch.Tensor,
        element_index: torch.Tensor,
        vectors: torch.Tensor,
        matrices: torch.Tensor,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        """``vectors`` and ``matrices`` (the neighbor basis of TargetHead) are unused;
        the pairs are the model's (``mirrored``: ``edge_vectors`` holds the first half,
        the second is the first reversed)."""
        hidden, geometry, first = self.pair_terms(
            features, element_index, edge_vectors, pair_first, pair_second, mirrored
        )
        weights = self.network[3](hidden)  # [pairs, 1]
        made = hidden.new_zeros((features.shape[0], geometry.shape[1]))
        made = made.index_add(0, first, weights * geometry) * self.scale.to(hidden.dtype)
        if self.matrix:
            identity = torch.eye(3, dtype=made.dtype, device=made.device).reshape(1, 9)
            baseline = self.baseline.index_select(0, element_index).to(made.dtype)
            made = made + baseline * identity
        return made

    def pair_terms(
        self,
        features: torch.Tensor,
        element_index: torch.Tensor,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        mirrored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each pair's input of the last linear map [pairs, HIDDEN_WIDTH], what its weight
        multiplies [pairs, 3 or 9] (its direction, or the direction's outer product, times
        the envelope), and its first atom [pairs]."""
        dtype = self.center.weight.dtype
        features = features.to(dtype)
        vectors = edge_vectors.to(dtype)
        if mirrored:
            vectors = torch.cat([vectors, -vectors])
        count = vectors.shape[0]
        first, second = pair_first[:count], pair_second[:count]
        distances = torch.linalg.vector_norm(vectors, dim=1)
        directions = vectors / distances.unsqueeze(1)
        radial, envelope = smooth_radial(distances, self.frequencies, self.cutoff)
        atoms = self.center(features) + self.element(element_index)
        # the distance filters the two atoms' terms (SchNet's continuous filter): added
        # instead, ethanol's direct forces were 91 meV/A against 66
        hidden = (
            atoms.index_select(0, first) + self.neighbor(features).index_select(0, second)
        ) * self.distance(radial)
        hidden = self.network[2](self.network[1](self.network[0](hidden)))
        if self.matrix:
            geometry = (directions.unsqueeze(2) * directions.unsqueeze(1)).reshape(-1, 9)
        else:
            geometry = directions
        return hidden, geometry * envelope.unsqueeze(1), first

    def last_layer_features(
        self,
        features: torch.Tensor,
        element_index: torch.Tensor,
        vectors: torch.Tensor,
        matrices: torch.Tensor,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        """The derivatives of each output value in the last linear map's weights and
        bias, up to the scale: [atoms, width, HIDDEN_WIDTH + 1] in float64 (the outputs
        are linear in them: these are their exact features)."""
        hidden, geometry, first = self.pair_terms(
            features, element_index, edge_vectors, pair_first, pair_second, mirrored
        )
        hidden = hidden.to(torch.float64)
        with_bias = torch.cat([hidden, torch.ones_like(hidden[:, :1])], dim=1)
        terms = geometry.to(torch.float64).unsqueeze(2) * with_bias.unsqueeze(1)
        total = terms.new_zeros((features.shape[0], geometry.shape[1], with_bias.shape[1]))
        return total.index_add(0, first, terms)

    @torch.jit.unused
    def networks_to(self, dtype: torch.dtype) -> None:
        """Its layers in ``dtype``; its baseline and scale stay float64."""
        for module in (self.center, self.neighbor, self.element, self.distance, self.network):
            module.to(dtype)
