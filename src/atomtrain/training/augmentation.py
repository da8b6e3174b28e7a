"""Random rotations of training structures, for architectures that are not invariant by
construction (PET): every epoch, each training structure is turned by a random
orthogonal matrix, a rotation or, with probability one half, a rotation times the
inversion (O(3), as metatrain's O3Augmenter draws them), and its labels with it.

The matrix of a structure depends on the run's seed, the epoch and the structure's
position in the training set only, so that any number of processes, and a resumed
run, train on the same turned structures.

How each label turns under an orthogonal matrix g (det g = +1 or -1):
- energies and scalars: unchanged; positions, forces, Cartesian vectors: ``g v``;
- stress and Cartesian rank-2 tensors: ``g M g^T``;
- a spherical block (o3_lambda, o3_sigma): as a polar tensor of rank o3_lambda (a
  vector for 1, a symmetric traceless matrix for 2), times det g when o3_sigma is -1.
Pair shifts count cell vectors, which turn with the cell, so the neighbor lists hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from ..data.batch import Batch
from ..models.heads import matrix_from_spherical, spherical_from_matrix
from ..targets import TargetSpec

# a vector's spherical components (o3_mu -1, 0, 1) are y, z, x
SPHERICAL_TO_XYZ = [2, 0, 1]
XYZ_TO_SPHERICAL = [1, 2, 0]


def random_transformations(seed: int, epoch: int, positions: Sequence[int]) -> torch.Tensor:
    """[n, 3, 3] float64: one random element of O(3) per training-set position."""
    # imported here: scipy.spatial takes 0.2 s, and only PET's runs turn structures
    from scipy.spatial.transform import Rotation

    matrices = np.empty((len(positions), 3, 3))
    for row, position in enumerate(positions):
        generator = np.random.default_rng([seed, epoch, int(position)])
        rotation = Rotation.random(random_state=generator).as_matrix()
        inverted = generator.random() < 0.5
        matrices[row] = -rotation if inverted else rotation
    return torch.from_numpy(matrices)


def turn_vectors(vectors: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """[n, 3, ...] Cartesian vectors (components on axis 1), each by its matrix."""
    return torch.einsum("nij,nj...->ni...", matrices, vectors)


def turn_matrices(tensors: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """[n, 3, 3, ...] Cartesian rank-2 tensors: g M g^T."""
    return torch.einsum("nij,njk...,nlk->nil...", matrices, tensors, matrices)


def turn_spherical(
    block: torch.Tensor, o3_lambda: int, o3_sigma: int, matrices: torch.Tensor
) -> torch.Tensor:
    """[n, 2 lambda + 1, subtargets] real spherical components, each by its matrix."""
    if o3_lambda == 0:
        turned = block
    elif o3_lambda == 1:
        xyz = block[:, SPHERICAL_TO_XYZ]
        turned = turn_vectors(xyz, matrices)[:, XYZ_TO_SPHERICAL]
    else:
        tensors = matrix_from_spherical(block.transpose(1, 2)).permute(0, 2, 3, 1)
        turned_tensors = turn_matrices(tensors, matrices)
        turned = spherical_from_matrix(turned_tensors.permute(0, 3, 1, 2)).transpose(1, 2)
    if o3_sigma == -1:
        turned = turned * torch.linalg.det(matrices).reshape(-1, 1, 1)
    return turned


def turn_target(values: torch.Tensor, spec: TargetSpec, matrices: torch.Tensor) -> torch.Tensor:
    """[n, width] values of ``spec`` laid out as the data holds them, each sample turned
    by its matrix (matrices [n, 3, 3])."""
    n = values.shape[0]
    shaped = values.reshape(n, spec.components, spec.num_subtargets)
    if spec.kind == "scalar":
        return values
    if spec.kind == "cartesian" and spec.rank == 1:
        return turn_vectors(shaped, matrices).reshape(n, -1)
    if spec.kind == "cartesian":
        tensors = shaped.reshape(n, 3, 3, spec.num_subtargets)
        return turn_matrices(tensors, matrices).reshape(n, -1)
    blocks = []
    offset = 0
    for irrep in spec.irreps:
        block = shaped[:, offset : offset + irrep.size]
        blocks.append(turn_spherical(block, irrep.o3_lambda, irrep.o3_sigma, matrices))
        offset += irrep.size
    return torch.cat(blocks, dim=1).reshape(n, -1)


def turned_batch(batch: Batch, matrices: torch.Tensor, specs: Sequence[TargetSpec]) -> Batch:
    """``batch`` with structure s turned by matrices[s], labels included."""
    matrices = matrices.to(batch.positions.dtype)
    per_atom = matrices.index_select(0, batch.system_index)
    targets = {}
    for spec in specs:
        if spec.name not in batch.targets:
            continue
        own = per_atom if spec.name in batch.atom_targets else matrices
        values = batch.targets[spec.name]
        targets[spec.name] = turn_target(values, spec, own.to(values.dtype))
    return replace(
        batch,
        positions=turn_vectors(batch.positions, per_atom),
        # the cell's rows are its vectors: each turns as a vector
        cell=batch.cell @ matrices.transpose(1, 2),
        forces=turn_vectors(batch.forces, per_atom) if batch.forces is not None else None,
        stress=turn_matrices(batch.stress, matrices) if batch.stress is not None else None,
        targets={**batch.targets, **targets},
    )
