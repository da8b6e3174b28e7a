"""Heads for targets other than the energy, on any architecture's invariant per-atom
features.

A head's network maps an atom's features (and element) to invariant coefficients; the
atom's equivariant outputs are these coefficients times a basis built from the geometry
of its neighbors (:class:`NeighborBasis`): vectors ``v_k = sum_j R_k(r_ij, Z_j) r_ij/r_ij``
and symmetric traceless matrices ``t_k = sum_j R_k(r_ij, Z_j) (r_ij r_ij / r_ij^2 -
I/3)``. Invariant coefficients times equivariant bases are exactly equivariant, so:

* o3_lambda 0 (scalars, a tensor's trace): the coefficients themselves;
* o3_lambda 1, proper (a vector): ``sum_k c_k v_k``;
* o3_lambda 1, pseudo (an axial vector, a tensor's antisymmetric part): ``u_1 x u_2``
  of two learnt mixtures ``u_a = sum_k c_ak v_k``;
* o3_lambda 2, proper (a symmetric traceless matrix): ``sum_k c_k t_k``;
* o3_lambda 2, pseudo: the symmetric traceless part of ``u_1 (u_2 x u_3)^T``.

Spherical components follow metatensor's real spherical harmonics (o3_mu -1, 0, 1 of a
vector are y, z, x; a matrix's five as metatrain converts them). Per-structure targets
are sums of atomic contributions (as metatrain's); each head has a scale and, for its
o3_lambda 0 part, per-element baselines, fitted from the training data.
"""

from __future__ import annotations

import math

import torch

from ..targets import TargetSpec

RADIAL_FUNCTIONS = 4
HIDDEN_WIDTH = 32


def smooth_radial(
    distances: torch.Tensor, frequencies: torch.Tensor, cutoff: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sines of each pair's distance [pairs, frequencies] times a cosine envelope over
    the distance, which vanish smoothly at the cutoff, and the envelope [pairs]."""
    envelope = 0.5 * (torch.cos(math.pi * distances / cutoff) + 1.0)
    envelope = torch.where(distances < cutoff, envelope, torch.zeros_like(envelope))
    waves = torch.sin(distances.unsqueeze(1) * frequencies.to(distances.dtype))
    return waves * (envelope / distances).unsqueeze(1), envelope


class NeighborBasis(torch.nn.Module):
    """Each atom's vectors [atoms, K, 3] and symmetric traceless matrices [atoms, K, 3, 3]
    (K = radial functions x elements), from its neighbor pairs."""

    def __init__(self, n_types: int, cutoff: float, with_matrices: bool):
        super().__init__()
        self.n_types = n_types
        self.cutoff = cutoff
        self.with_matrices = with_matrices
        self.radial_functions = RADIAL_FUNCTIONS
        self.channels = RADIAL_FUNCTIONS * n_types
        self.register_buffer(
            "frequencies",
            torch.arange(1, RADIAL_FUNCTIONS + 1, dtype=torch.float64) * math.pi / cutoff,
        )

    def radial(self, distances: torch.Tensor) -> torch.Tensor:
        """[pairs, radial functions]: smooth radial functions of each pair's distance."""
        return smooth_radial(distances, self.frequencies, self.cutoff)[0]

    def forward(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``mirrored``: ``edge_vectors`` holds the first half of the pairs, and the second
        half is the first reversed (each vector negated). A pair adds to its atom's
        channels of its neighbor's element: each atom has a row per element, indexed
        atom x elements + element, so no pair carries the other elements' zeros."""
        n_atoms = element_index.shape[0]
        computed = edge_vectors.shape[0]
        first = pair_first[:computed]
        second = pair_second[:computed]
        distances = torch.linalg.vector_norm(edge_vectors, dim=1)
        directions = edge_vectors / distances.unsqueeze(1)
        functions = self.radial(distances)  # [pairs, R]
        rows = n_atoms * self.n_types
        slots = first * self.n_types + element_index.index_select(0, second)
        back = slots  # the reversed pairs' rows, when the list is mirrored
        if mirrored:
            back = second * self.n_types + element_index.index_select(0, first)
        contribution = functions.unsqueeze(2) * directions.unsqueeze(1)  # [pairs, R, 3]
        vectors = edge_vectors.new_zeros((rows, self.radial_functions, 3))
        vectors = vectors.index_add(0, slots, contribution)
        if mirrored:  # the reversed pairs: j's neighbor i, at -r
            vectors = vectors.index_add(0, back, -contribution)
        vectors = vectors.reshape(n_atoms, self.channels, 3)
        matrices = edge_vectors.new_zeros((n_atoms, 0, 3, 3))
        if self.with_matrices:
            identity = torch.eye(3, dtype=edge_vectors.dtype, device=edge_vectors.device)
            outer = directions.unsqueeze(2) * directions.unsqueeze(1) - identity / 3.0
            terms = functions.reshape(-1, self.radial_functions, 1, 1) * outer.unsqueeze(1)
            matrices = edge_vectors.new_zeros((rows, self.radial_functions, 3, 3))
            matrices = matrices.index_add(0, slots, terms)
            if mirrored:  # the same outer product for the reversed pair
                matrices = matrices.index_add(0, back, terms)
            matrices = matrices.reshape(n_atoms, self.channels, 3, 3)
        return vectors, matrices


def coefficients_of(o3_lambda: int, o3_sigma: int, channels: int) -> int:
    """Invariant coefficients a block needs per subtarget."""
    if o3_lambda == 0:
        return 1
    mixtures = {(1, 1): 1, (1, -1): 2, (2, 1): 1, (2, -1): 3}[(o3_lambda, o3_sigma)]
    return mixtures * channels


def spherical_from_matrix(matrix: torch.Tensor) -> torch.Tensor:
    """[..., 3, 3] symmetric traceless -> [..., 5] real spherical components (o3_mu -2..2),
    as metatrain converts a polarisability."""
    xx, yy, zz = matrix[..., 0, 0], matrix[..., 1, 1], matrix[..., 2, 2]
    xy = 0.5 * (matrix[..., 0, 1] + matrix[..., 1, 0])
    yz = 0.5 * (matrix[..., 1, 2] + matrix[..., 2, 1])
    xz = 0.5 * (matrix[..., 0, 2] + matrix[..., 2, 0])
    return torch.stack(
        [xy, yz, (2.0 * zz - xx - yy) / (2.0 * math.sqrt(3.0)), xz, 0.5 * (xx - yy)], dim=-1
    )


def symmetric_traceless(matrix: torch.Tensor) -> torch.Tensor:
    symmetric = 0.5 * (matrix + matrix.transpose(-1, -2))
    trace = torch.diagonal(symmetric, dim1=-2, dim2=-1).sum(-1)
    identity = torch.eye(3, dtype=matrix.dtype, device=matrix.device)
    return symmetric - trace[..., None, None] * identity / 3.0


def antisymmetric_from(axial: torch.Tensor) -> torch.Tensor:
    """[..., 3] axial vector p -> [..., 3, 3] matrix A with A_ab = eps_abc p_c."""
    x, y, z = axial[..., 0], axial[..., 1], axial[..., 2]
    zero = torch.zeros_like(x)
    return torch.stack(
        [
            torch.stack([zero, z, -y], dim=-1),
            torch.stack([-z, zero, x], dim=-1),
            torch.stack([y, -x, zero], dim=-1),
        ],
        dim=-2,
    )


class TargetHead(torch.nn.Module):
    """One mtt:: target's head: per-atom outputs [atoms, width] in the file's layout."""

    def __init__(self, spec: TargetSpec, n_types: int, n_features: int, channels: int):
        super().__init__()
        self.kind = spec.kind
        self.rank = spec.rank
        self.per_atom = spec.per_atom
        self.subtargets = spec.num_subtargets
        self.width = spec.width
        self.channels = channels
        self.blocks = [(irrep.o3_lambda, irrep.o3_sigma) for irrep in spec.blocks()]
        self.n_types = n_types
        sizes = [coefficients_of(a, b, channels) * spec.num_subtargets for a, b in self.blocks]
        self.sizes = sizes
        # the first layer takes the features and, as a learnt vector per element, the
        # element (a concatenated one-hot would copy the features at every call)
        self.first = torch.nn.Linear(n_features, HIDDEN_WIDTH)
        self.element = torch.nn.Embedding(n_types, HIDDEN_WIDTH)
        torch.nn.init.zeros_(self.element.weight)
        self.network = torch.nn.Sequential(
            torch.nn.SiLU(),
            torch.nn.Linear(HIDDEN_WIDTH, HIDDEN_WIDTH),
            torch.nn.SiLU(),
            torch.nn.Linear(HIDDEN_WIDTH, sum(sizes)),
        )
        # starts at the baseline: an untrained head adds nothing (noise of the target's
        # scale otherwise, which on QM7-X took more epochs to unlearn than to learn)
        torch.nn.init.zeros_(self.network[-1].weight)
        torch.nn.init.zeros_(self.network[-1].bias)
        # the o3_lambda 0 block's per-element baseline (its position in self.blocks), and
        # the scale of every output: fitted from the training data
        self.isotropic = self.blocks.index((0, 1)) if (0, 1) in self.blocks else -1
        self.register_buffer(
            "baseline", torch.zeros((n_types, spec.num_subtargets), dtype=torch.float64)
        )
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
        """Each atom's values [atoms, width]; the pairs (``edge_vectors`` ...) are for
        the direct targets' heads (pair_heads.PairHead), which take the same arguments."""
        n_atoms = features.shape[0]
        coefficients = self.coefficients(features, element_index).to(vectors.dtype)
        s = self.subtargets
        k = self.channels
        made: list[torch.Tensor] = []  # each block [atoms, 2 lambda + 1, s]
        offset = 0
        for position, (o3_lambda, o3_sigma) in enumerate(self.blocks):
            size = self.sizes[position]
            c = coefficients[:, offset : offset + size]
            offset += size
            if o3_lambda == 0:
                block = c.reshape(n_atoms, 1, s) * self.scale.to(c.dtype)
                if position == self.isotropic:
                    baseline = self.baseline.index_select(0, element_index).to(c.dtype)
                    block = block + baseline.reshape(n_atoms, 1, s)
                made.append(block)
                continue
            mixtures = c.reshape(n_atoms, size // (k * s), k, s)  # [atoms, mixtures, K, s]
            if o3_lambda == 1:
                if o3_sigma == 1:  # sum_k c_k v_k (a product and a sum: a batched
                    # matrix product of [3, K] @ [K, s] per atom costs more at these sizes)
                    vector = (vectors.unsqueeze(3) * mixtures[:, 0].unsqueeze(2)).sum(1)
                else:
                    u = torch.einsum("amks,akx->amxs", mixtures, vectors)  # [atoms, m, 3, s]
                    vector = torch.cross(u[:, 0], u[:, 1], dim=1)
                if self.kind == "cartesian" and self.rank == 1:  # x, y, z as made
                    made.append(vector * self.scale.to(vector.dtype))
                    continue
                block = torch.roll(vector, -1, 1)  # y, z, x: metatensor's o3_mu -1, 0, 1
            else:
                if o3_sigma == 1:
                    matrix = torch.einsum("aks,akxy->axys", mixtures[:, 0], matrices)
                else:
                    u = torch.einsum("amks,akx->amxs", mixtures, vectors)
                    axial = torch.cross(u[:, 1], u[:, 2], dim=1)
                    outer = u[:, 0].unsqueeze(2) * axial.unsqueeze(1)  # [atoms, 3, 3, s]
                    matrix = symmetric_traceless(outer.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
                block = spherical_from_matrix(matrix.permute(0, 3, 1, 2)).permute(0, 2, 1)
            made.append(block * self.scale.to(block.dtype))
        return self.layout(made, True).reshape(n_atoms, self.width)

    def coefficients(self, features: torch.Tensor, element_index: torch.Tensor) -> torch.Tensor:
        """The network's invariant outputs for each atom."""
        return self.network[3](self.hidden(features, element_index))

    def hidden(self, features: torch.Tensor, element_index: torch.Tensor) -> torch.Tensor:
        """The input of the network's last linear map, [atoms, HIDDEN_WIDTH]: the head's
        outputs are linear in that map's weights, with this (and a constant) as input."""
        hidden = self.first(features) + self.element(element_index)
        hidden = self.network[1](torch.nn.functional.silu(hidden))
        return torch.nn.functional.silu(hidden)

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
        """The derivatives of each output value (components and subtargets, laid out as
        forward's) in the last linear map's weights, up to the scale: [atoms, width,
        last-layer width] in float64. A block of o3_lambda 0 takes the hidden layer (its
        bias is a constant input, left out as the energy's); a block of o3_lambda 1 or 2
        takes each coefficient's derivative (a basis vector's or matrix's components, and
        for a pseudo block, a product of the other mixtures with them) times the hidden
        layer and the bias. Proper blocks are linear in the weights, so these are their
        exact features; a pseudo block's are its linearisation at the trained weights
        (Gauss-Newton's). Blocks use disjoint weights, each its own columns; every
        subtarget has its own weights with the same columns."""
        hidden = self.hidden(features, element_index)
        coefficients = self.network[3](hidden).to(torch.float64)
        hidden = hidden.to(torch.float64)
        n_atoms = hidden.shape[0]
        s = self.subtargets
        with_bias = torch.cat([hidden, torch.ones_like(hidden[:, :1])], dim=1)
        parts: list[torch.Tensor] = []  # each [atoms, 2 lambda + 1, s, block width]
        offset = 0
        for position, (o3_lambda, o3_sigma) in enumerate(self.blocks):
            size = self.sizes[position]
            c = coefficients[:, offset : offset + size]
            offset += size
            if o3_lambda == 0:
                parts.append(hidden.reshape(n_atoms, 1, 1, -1).expand(-1, -1, s, -1))
                continue
            mixtures = c.reshape(n_atoms, size // (self.channels * s), self.channels, s)
            gradients = coefficient_gradients(
                o3_lambda,
                o3_sigma,
                mixtures,
                vectors.to(torch.float64),
                matrices.to(torch.float64),
            )  # [atoms, components, s, mixtures x K]
            outer = gradients.unsqueeze(4) * with_bias.reshape(n_atoms, 1, 1, 1, -1)
            parts.append(outer.reshape(n_atoms, outer.shape[1], s, -1))
        total = 0
        for part in parts:
            total += part.shape[3]
        made: list[torch.Tensor] = []
        column = 0
        for part in parts:  # each block in its own columns, laid out as forward's
            placed = hidden.new_zeros((n_atoms, part.shape[1], s, total))
            placed[:, :, :, column : column + part.shape[3]] = part
            column += part.shape[3]
            made.append(placed.reshape(n_atoms, part.shape[1], s * total))
        return self.layout(made).reshape(n_atoms, -1, total)

    @torch.jit.unused
    def networks_to(self, dtype: torch.dtype) -> None:
        """Its layers in ``dtype``; its baseline and scale stay float64."""
        for module in (self.first, self.element, self.network):
            module.to(dtype)

    def energies(self, features: torch.Tensor, element_index: torch.Tensor) -> torch.Tensor:
        """As an energy variant's head: each atom's energy [atoms] in float64 (its scale
        and per-element baseline applied in float64: total energies can be large)."""
        raw = self.coefficients(features, element_index)[:, 0].to(torch.float64)
        return raw * self.scale + self.baseline[:, 0].index_select(0, element_index)

    def layout(self, made: list[torch.Tensor], vector_in_xyz: bool = False) -> torch.Tensor:
        """The blocks as the file lays the target out: [atoms, *components, s].
        ``vector_in_xyz``: a Cartesian vector's block is already x, y, z (forward makes
        it so), not metatensor's y, z, x."""
        if self.kind == "spherical" or self.kind == "scalar":
            return torch.cat(made, dim=1)
        if self.rank == 1:  # back from y, z, x to x, y, z
            return made[0] if vector_in_xyz else torch.roll(made[0], 1, 1)
        trace, axial, traceless = made[0], made[1], made[2]  # [atoms, 1 | 3 | 5, s]
        xyz = torch.roll(axial, 1, 1)
        antisymmetric = antisymmetric_from(xyz.transpose(1, 2))  # [atoms, s, 3, 3]
        matrix = matrix_from_spherical(traceless.transpose(1, 2)) + antisymmetric
        identity = torch.eye(3, dtype=trace.dtype, device=trace.device)
        matrix = matrix + trace.transpose(1, 2).unsqueeze(-1) * identity
        return matrix.permute(0, 2, 3, 1)  # [atoms, 3, 3, s]


def coefficient_gradients(
    o3_lambda: int,
    o3_sigma: int,
    mixtures: torch.Tensor,
    vectors: torch.Tensor,
    matrices: torch.Tensor,
) -> torch.Tensor:
    """The derivatives of a block's components in its invariant coefficients, as
    TargetHead.forward makes the block of them: [atoms, 2 lambda + 1, subtargets,
    mixtures x K] (``mixtures``: the coefficients [atoms, mixtures, K, subtargets]; the
    components in metatensor's o3_mu order)."""
    n_atoms, k, s = mixtures.shape[0], mixtures.shape[2], mixtures.shape[3]
    if o3_sigma == 1:  # linear: the basis itself, the same for every subtarget
        if o3_lambda == 1:  # y, z, x
            basis = torch.roll(vectors, -1, 2)
        else:
            basis = spherical_from_matrix(matrices)
        return basis.transpose(1, 2).unsqueeze(2).expand(-1, -1, s, -1)
    u = torch.einsum("amks,akx->amxs", mixtures, vectors)  # [atoms, m, 3, s]
    v = vectors.unsqueeze(3).expand(-1, -1, -1, s)  # [atoms, K, 3, s]
    if o3_lambda == 1:  # u_1 x u_2
        first = torch.cross(v, u[:, 1].unsqueeze(1).expand(-1, k, -1, -1), dim=2)
        second = torch.cross(u[:, 0].unsqueeze(1).expand(-1, k, -1, -1), v, dim=2)
        stacked = torch.stack([first, second], dim=1)  # [atoms, 2, K, 3, s]
        vector = stacked.permute(0, 3, 4, 1, 2).reshape(n_atoms, 3, s, 2 * k)
        return torch.roll(vector, -1, 1)
    # the symmetric traceless part of u_0 (u_1 x u_2)^T
    axial = torch.cross(u[:, 1], u[:, 2], dim=1)  # [atoms, 3, s]
    u0 = u[:, 0].unsqueeze(1).unsqueeze(3)  # [atoms, 1, 3, 1, s]
    through_first = torch.cross(v, u[:, 2].unsqueeze(1).expand(-1, k, -1, -1), dim=2)
    through_second = torch.cross(u[:, 1].unsqueeze(1).expand(-1, k, -1, -1), v, dim=2)
    outers = torch.stack(
        [
            v.unsqueeze(3) * axial.reshape(n_atoms, 1, 1, 3, s),
            u0 * through_first.unsqueeze(2),
            u0 * through_second.unsqueeze(2),
        ],
        dim=1,
    )  # [atoms, 3, K, 3, 3, s]
    matrix = symmetric_traceless(outers.permute(0, 1, 2, 5, 3, 4))  # [atoms, 3, K, s, 3, 3]
    components = spherical_from_matrix(matrix)  # [atoms, 3, K, s, 5]
    return components.permute(0, 4, 3, 1, 2).reshape(n_atoms, 5, s, 3 * k)


def matrix_from_spherical(components: torch.Tensor) -> torch.Tensor:
    """[..., 5] -> [..., 3, 3] symmetric traceless: the inverse of spherical_from_matrix."""
    m2, m1, m0 = components[..., 0], components[..., 1], components[..., 2]
    p1, p2 = components[..., 3], components[..., 4]
    zz = 2.0 * m0 / math.sqrt(3.0)
    xx = p2 - zz / 2.0
    yy = -p2 - zz / 2.0
    return torch.stack(
        [
            torch.stack([xx, m2, p1], dim=-1),
            torch.stack([m2, yy, m1], dim=-1),
            torch.stack([p1, m1, zz], dim=-1),
        ],
        dim=-2,
    )
